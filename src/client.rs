//! Connecting to an archivist server, and reading the rich error details of
//! a failed call back into plain data.

use std::time::Duration;

use std::path::PathBuf;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_types::StatusExt;

use crate::failure::Failure;
use crate::pb;
use crate::pb::archivist_client::ArchivistClient;
use crate::wire::failure_from_pb;

pub const DEFAULT_SERVER: &str = "http://127.0.0.1:50051";

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0:?} is not a server address (write it like http://127.0.0.1:50051)")]
    BadAddress(String, #[source] tonic::transport::Error),
    #[error("cannot connect to {0}")]
    Connect(String, #[source] tonic::transport::Error),
    #[error(
        "cannot connect to {0}: nothing listens there; is `archivist serve` running, and on this address? (--server or ARCHIVIST_SERVER sets it)"
    )]
    Refused(String, #[source] tonic::transport::Error),
    #[error(
        "cannot connect to {0}: the server there does not speak TLS (it answered in plaintext); use {1}, or turn on [tls] on the server"
    )]
    NotTls(String, String, #[source] tonic::transport::Error),
    #[error("cannot connect to {0}: no answer within {1}")]
    ConnectTimeout(String, String),
    #[error("cannot set up TLS for {0}")]
    Tls(String, #[source] tonic::transport::Error),
    #[error("cannot read {0}")]
    Read(PathBuf, #[source] std::io::Error),
    #[error("a client certificate needs its key, and a key its certificate")]
    HalfIdentity,
    #[error("the token is not valid header text")]
    BadToken,
    #[error("TLS options were given but {0} is not an https:// address")]
    TlsNeedsHttps(String),
}

/// A connected client; every call carries the bearer token, if one is set.
pub type Client = ArchivistClient<InterceptedService<Channel, BearerToken>>;

/// How to reach a server.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// `http://host:port`, or `https://host:port` for TLS.
    pub address: String,
    /// The tenant's token, sent as `authorization: Bearer <token>`.
    pub token: Option<String>,
    /// PEM CA certificate(s) to trust for the server's certificate (the
    /// public web roots are trusted otherwise).
    pub ca_cert: Option<PathBuf>,
    /// PEM certificate and key to present, for mutual TLS.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// The longest the connection may take to set up.
    pub connect_timeout: Option<Duration>,
}

/// Adds the bearer token to every call.
#[derive(Clone)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl Interceptor for BearerToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// Connects to the server at `address` (`http://host:port`), with no token.
pub async fn connect(address: &str) -> Result<Client, ConnectError> {
    connect_with(&ClientOptions {
        address: address.to_owned(),
        ..ClientOptions::default()
    })
    .await
}

/// Connects as `options` say: TLS for `https://`, a token on every call.
pub async fn connect_with(options: &ClientOptions) -> Result<Client, ConnectError> {
    let address = options.address.as_str();
    let mut endpoint = Endpoint::from_shared(address.to_owned())
        .map_err(|e| ConnectError::BadAddress(address.to_owned(), e))?
        .tcp_nodelay(true);
    let tls_asked = options.ca_cert.is_some() || options.client_cert.is_some();
    if tls_asked && !address.starts_with("https://") {
        return Err(ConnectError::TlsNeedsHttps(address.to_owned()));
    }
    if address.starts_with("https://") {
        let mut tls = ClientTlsConfig::new().with_webpki_roots();
        if let Some(ca) = &options.ca_cert {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        match (&options.client_cert, &options.client_key) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            (None, None) => {}
            _ => return Err(ConnectError::HalfIdentity),
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| ConnectError::Tls(address.to_owned(), e))?;
    }
    let token = match &options.token {
        Some(token) => Some(
            format!("Bearer {token}")
                .parse::<MetadataValue<Ascii>>()
                .map_err(|_| ConnectError::BadToken)?,
        ),
        None => None,
    };
    if let Some(limit) = options.connect_timeout {
        endpoint = endpoint.connect_timeout(limit);
    }
    let channel = endpoint.connect().await.map_err(|e| {
        let address = address.to_owned();
        if answered_in_plaintext(&e) {
            let plain = address.replacen("https://", "http://", 1);
            ConnectError::NotTls(address, plain, e)
        } else if io_kind(&e) == Some(std::io::ErrorKind::ConnectionRefused) {
            ConnectError::Refused(address, e)
        } else if io_kind(&e) == Some(std::io::ErrorKind::TimedOut) {
            let limit = options
                .connect_timeout
                .map(crate::text::human_duration)
                .unwrap_or_else(|| "the time allowed".to_owned());
            ConnectError::ConnectTimeout(address, limit)
        } else {
            ConnectError::Connect(address, e)
        }
    })?;
    Ok(ArchivistClient::with_interceptor(
        channel,
        BearerToken(token),
    ))
}

/// Every error in `err`'s chain, and the error inside each `io::Error`
/// (whose `source()` skips it).
fn chain<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut out = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        out.push(e);
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            out.push(inner);
        }
        next = e.source();
    }
    out
}

/// The kind of the first I/O error in the chain, if there is one.
fn io_kind(err: &tonic::transport::Error) -> Option<std::io::ErrorKind> {
    chain(err)
        .into_iter()
        .find_map(|e| e.downcast_ref::<std::io::Error>().map(std::io::Error::kind))
}

/// A TLS handshake answered with something that is not TLS: the server
/// speaks plaintext.
fn answered_in_plaintext(err: &tonic::transport::Error) -> bool {
    chain(err).into_iter().any(|e| {
        matches!(
            e.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType
            ))
        )
    })
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|e| ConnectError::Read(path.to_owned(), e))
}

/// A failed call, decoded from its status and rich error details: what a
/// client acts on (the code, the reason, the typed recap failure) and what
/// a person reads (the message and every cause, outermost first).
#[derive(Clone, Debug)]
pub struct CallError {
    pub code: tonic::Code,
    pub message: String,
    /// ErrorInfo's reason, UPPER_SNAKE.
    pub reason: Option<String>,
    pub metadata: Vec<(String, String)>,
    /// Field and description of each bad field (BadRequest).
    pub violations: Vec<(String, String)>,
    /// The cause chain, outermost first (DebugInfo).
    pub causes: Vec<String>,
    /// How long to wait before calling again (RetryInfo).
    pub retry_after: Option<Duration>,
    /// The recap failure, when one is the cause.
    pub failure: Option<Failure>,
}

impl CallError {
    pub fn from_status(status: &tonic::Status) -> CallError {
        let details = status.get_error_details();
        let (reason, metadata) = match details.error_info() {
            Some(info) => {
                let mut metadata: Vec<(String, String)> = info
                    .metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                metadata.sort();
                (Some(info.reason.clone()), metadata)
            }
            None => (None, Vec::new()),
        };
        CallError {
            code: status.code(),
            message: status.message().to_owned(),
            reason,
            metadata,
            violations: details
                .bad_request()
                .map(|bad| {
                    bad.field_violations
                        .iter()
                        .map(|v| (v.field.clone(), v.description.clone()))
                        .collect()
                })
                .unwrap_or_default(),
            causes: details
                .debug_info()
                .map(|d| d.stack_entries.clone())
                .unwrap_or_default(),
            retry_after: details.retry_info().and_then(|r| r.retry_delay),
            failure: failure_detail(status).and_then(|f| failure_from_pb(&f)),
        }
    }

    /// Every cause, outermost first: the recap failure's own chain where
    /// there is one, else the status's DebugInfo.
    pub fn chain(&self) -> &[String] {
        match &self.failure {
            Some(f) if !f.causes.is_empty() => &f.causes,
            _ => &self.causes,
        }
    }
}

impl From<tonic::Status> for CallError {
    fn from(status: tonic::Status) -> CallError {
        CallError::from_status(&status)
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)?;
        if let Some(reason) = &self.reason {
            write!(f, " [{reason}]")?;
        }
        Ok(())
    }
}

impl std::error::Error for CallError {}

/// A recap's failure as typed data: a segment's `last_failure` (where the
/// server puts a failed recap), or a status's detail; None for a kind this
/// build does not know.
pub fn decode_failure(failure: &pb::Failure) -> Option<Failure> {
    failure_from_pb(failure)
}

/// The `archivist.v1.Failure` detail of a status, if it carries one.
pub fn failure_detail(status: &tonic::Status) -> Option<pb::Failure> {
    crate::wire::failure_detail(status.details())
}
