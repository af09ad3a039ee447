//! Connecting to an archivist server, and reading the rich error details of
//! a failed call back into plain data.

use prost::Message;
use tonic::transport::{Channel, Endpoint};
use tonic_types::StatusExt;

use crate::grpc::FAILURE_TYPE_URL;
use crate::pb;
use crate::pb::archivist_client::ArchivistClient;

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:50051";

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0:?} is not a server address (write it like http://127.0.0.1:50051)")]
    BadAddress(String, #[source] tonic::transport::Error),
    #[error("cannot connect to {0}")]
    Connect(String, #[source] tonic::transport::Error),
}

/// Connects to the server at `address` (`http://host:port`).
pub async fn connect(address: &str) -> Result<ArchivistClient<Channel>, ConnectError> {
    let endpoint = Endpoint::from_shared(address.to_owned())
        .map_err(|e| ConnectError::BadAddress(address.to_owned(), e))?
        .tcp_nodelay(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| ConnectError::Connect(address.to_owned(), e))?;
    Ok(ArchivistClient::new(channel))
}

/// What a failed call's status carries, decoded.
#[derive(Clone, Debug, Default)]
pub struct ErrorReport {
    pub reason: Option<String>,
    pub metadata: Vec<(String, String)>,
    /// Field and description of each bad field.
    pub violations: Vec<(String, String)>,
    /// The cause chain, outermost first.
    pub causes: Vec<String>,
    pub retry_after: Option<std::time::Duration>,
    pub failure: Option<pb::Failure>,
}

impl ErrorReport {
    pub fn from_status(status: &tonic::Status) -> ErrorReport {
        let details = status.get_error_details();
        let mut report = ErrorReport::default();
        if let Some(info) = details.error_info() {
            report.reason = Some(info.reason.clone());
            let mut metadata: Vec<(String, String)> = info
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            metadata.sort();
            report.metadata = metadata;
        }
        if let Some(bad) = details.bad_request() {
            report.violations = bad
                .field_violations
                .iter()
                .map(|v| (v.field.clone(), v.description.clone()))
                .collect();
        }
        if let Some(debug) = details.debug_info() {
            report.causes = debug.stack_entries.clone();
        }
        report.retry_after = details.retry_info().and_then(|r| r.retry_delay);
        report.failure = failure_detail(status);
        report
    }
}

/// The `archivist.v1.Failure` detail of a status, if it carries one.
pub fn failure_detail(status: &tonic::Status) -> Option<pb::Failure> {
    let rpc = tonic_types::pb::Status::decode(status.details()).ok()?;
    rpc.details
        .iter()
        .find(|any| any.type_url == FAILURE_TYPE_URL)
        .and_then(|any| pb::Failure::decode(any.value.as_slice()).ok())
}
