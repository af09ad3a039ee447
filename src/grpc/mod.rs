//! The gRPC face of archivist: the tonic service, whose handlers check and
//! convert each request at the edge (`validate.rs`), call `service.rs`, and
//! convert back (`wire.rs`), keeping every answer within the message limit
//! (`fit.rs`); every error becomes a status in `status.rs`. Authentication
//! is an interceptor here, run before anything of a request's body is read;
//! the layers around calls (metrics, naming refusals, reading requests
//! whole, load shedding) are in `gate.rs`.

mod conn;
mod fit;
mod gate;
mod status;
mod validate;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::auth::{Auth, AuthError};
use crate::config::LimitsConfig;
use crate::events::{EventKind, Watch};
use crate::model::Tenant;
use crate::pb;
use crate::service::{SearchMode, Service};
use crate::store::Leg;
use crate::wire::{
    append_to_pb, backlog_to_pb, entry_to_pb, event_to_pb, gap_to_pb, role_to_pb, segment_to_pb,
    session_info_to_pb, timestamp,
};
pub(crate) use conn::Incoming;
use fit::{fit_context, fit_entry, fit_flush, fit_page, fit_segment};
pub(crate) use gate::{NameRefusals, RecordCalls};
use gate::{Searches, Shed, Whole};
pub(crate) use status::ERROR_DOMAIN;
use status::{invalid, service_status};
use validate::{
    call_deadline, page_token, parse_append, parse_get_context, parse_list, parse_list_entries,
    parse_list_sessions, parse_requeue, parse_search, parse_session, parse_subject,
    session_page_token,
};

pub(crate) struct GrpcService {
    service: Arc<Service>,
    limits: LimitsConfig,
    /// Each tenant's running searches: Search's (taken in `Shed`) and
    /// GetContext's with a query (taken in its handler).
    searches: Arc<Searches>,
}

impl GrpcService {
    pub(crate) fn new(service: Arc<Service>, limits: LimitsConfig) -> GrpcService {
        let searches = Searches::new(limits.max_concurrent_calls as usize);
        GrpcService {
            service,
            limits,
            searches,
        }
    }

    /// The largest answer: what the server reads is what it sends.
    fn response_limit(&self) -> usize {
        self.limits.max_message_bytes as usize
    }

    /// A segment as an answer carries it, within the message limit.
    fn segment_out(&self, segment: crate::model::Segment) -> pb::Segment {
        let mut segment = segment_to_pb(segment);
        fit_segment(&mut segment, self.response_limit());
        segment
    }

    /// The service as tonic serves it: each call authenticated first, then
    /// its request read whole (within the message limit and the request
    /// timeout), then given a call slot if one is free; reading messages up
    /// to `max_message_bytes` and never sending a larger one.
    pub(crate) fn into_server(self, auth: Arc<Auth>) -> ArchivistService {
        let limits = self.limits.clone();
        let max_message_bytes = limits.max_message_bytes as usize;
        let searches = self.searches.clone();
        let server = pb::archivist_server::ArchivistServer::new(self)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes);
        let shed = Shed::new(server, limits.max_concurrent_calls as usize, searches);
        InterceptedService::new(Whole::new(shed, &limits), Authenticator { auth })
    }
}

/// The archivist service with its own layers, as the server mounts it.
pub(crate) type ArchivistService = InterceptedService<
    Whole<Shed<pb::archivist_server::ArchivistServer<GrpcService>>>,
    Authenticator,
>;

/// Resolves each call's tenant from its bearer token before the call runs;
/// a call without a valid token goes no further.
#[derive(Clone)]
pub(crate) struct Authenticator {
    auth: Arc<Auth>,
}

impl Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match self.auth.tenant(header) {
            Ok(tenant) => {
                request.extensions_mut().insert(tenant);
                Ok(request)
            }
            Err(e) => {
                let reason = match e {
                    AuthError::Missing => "MISSING_TOKEN",
                    AuthError::Invalid => "INVALID_TOKEN",
                };
                let mut details = ErrorDetails::new();
                details.set_error_info(reason, ERROR_DOMAIN, HashMap::new());
                Err(Status::with_error_details(
                    Code::Unauthenticated,
                    e.to_string(),
                    details,
                ))
            }
        }
    }
}

/// The caller's tenant, as the authenticator resolved it. A call that
/// reached a handler without passing the authenticator is a wiring bug: it
/// fails closed rather than running as the default tenant.
fn tenant<T>(request: &Request<T>) -> Result<Tenant, Status> {
    request
        .extensions()
        .get::<Tenant>()
        .cloned()
        .ok_or_else(|| Status::internal("the call was not authenticated"))
}

#[tonic::async_trait]
impl pb::archivist_server::Archivist for GrpcService {
    async fn append_entries(
        &self,
        request: Request<pb::AppendEntriesRequest>,
    ) -> Result<Response<pb::AppendEntriesResponse>, Status> {
        let tenant = tenant(&request)?;
        let (session, subject, entries) = parse_append(request.into_inner(), &self.limits)?;
        let outcome = self
            .service
            .append(&tenant, &session, subject.as_ref(), entries)
            .await
            .map_err(service_status)?;
        Ok(Response::new(append_to_pb(outcome)))
    }

    async fn close_segment(
        &self,
        request: Request<pb::CloseSegmentRequest>,
    ) -> Result<Response<pb::CloseSegmentResponse>, Status> {
        let tenant = tenant(&request)?;
        let deadline = call_deadline(&request);
        let req = request.into_inner();
        let session = parse_session(&req.session_id, "session_id").map_err(invalid)?;
        // Without a deadline a waiting close is bounded by the pass itself.
        let wait_until = req
            .wait
            .then(|| deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(24 * 3600)));
        let segment = self
            .service
            .close_segment(&tenant, &session, wait_until)
            .await
            .map_err(service_status)?;
        Ok(Response::new(pb::CloseSegmentResponse {
            segment: segment.map(|s| self.segment_out(s)),
        }))
    }

    async fn flush_session(
        &self,
        request: Request<pb::FlushSessionRequest>,
    ) -> Result<Response<pb::FlushSessionResponse>, Status> {
        let tenant = tenant(&request)?;
        let deadline = call_deadline(&request);
        let req = request.into_inner();
        let session = parse_session(&req.session_id, "session_id").map_err(invalid)?;
        let flushed = self
            .service
            .flush(&tenant, &session, deadline)
            .await
            .map_err(service_status)?;
        let mut segments: Vec<pb::Segment> =
            flushed.segments.into_iter().map(segment_to_pb).collect();
        fit_flush(&mut segments, self.response_limit());
        Ok(Response::new(pb::FlushSessionResponse {
            segments,
            complete: flushed.complete,
        }))
    }

    async fn get_segment(
        &self,
        request: Request<pb::GetSegmentRequest>,
    ) -> Result<Response<pb::Segment>, Status> {
        let tenant = tenant(&request)?;
        let id = request.into_inner().segment_id;
        let segment = self
            .service
            .segment(&tenant, id)
            .await
            .map_err(service_status)?;
        Ok(Response::new(self.segment_out(segment)))
    }

    async fn list_segments(
        &self,
        request: Request<pb::ListSegmentsRequest>,
    ) -> Result<Response<pb::ListSegmentsResponse>, Status> {
        let tenant = tenant(&request)?;
        let (filter, after, page_size) = parse_list(request.into_inner())?;
        let page = self
            .service
            .list_segments(&tenant, filter, after, page_size)
            .await
            .map_err(service_status)?;
        let mut segments: Vec<pb::Segment> = page.items.into_iter().map(segment_to_pb).collect();
        let next_after = fit_page(
            &mut segments,
            self.response_limit(),
            fit_segment,
            |s| s.id,
            page.next_after,
        );
        Ok(Response::new(pb::ListSegmentsResponse {
            segments,
            next_page_token: next_after.map(page_token).unwrap_or_default(),
        }))
    }

    async fn get_context(
        &self,
        request: Request<pb::GetContextRequest>,
    ) -> Result<Response<pb::GetContextResponse>, Status> {
        let tenant = tenant(&request)?;
        let req = request.into_inner();
        let (session, recall) = parse_get_context(&req)?;
        // With a query the call searches, and waits on the embedder as a
        // search does: it takes one of the tenant's search turns.
        let _turn = match recall {
            Some(_) => Some(self.searches.turn(&tenant)?),
            None => None,
        };
        let context = self
            .service
            .context(&tenant, &session, req.max_tokens, recall.as_ref())
            .await
            .map_err(service_status)?;
        Ok(Response::new(fit_context(context, self.response_limit())))
    }

    async fn requeue_segments(
        &self,
        request: Request<pb::RequeueSegmentsRequest>,
    ) -> Result<Response<pb::RequeueSegmentsResponse>, Status> {
        let tenant = tenant(&request)?;
        let req = request.into_inner();
        let session = parse_requeue(&req)?;
        let (requeued, embeddings_requeued) = self
            .service
            .requeue(&tenant, session, req.segment_ids, req.include_parked)
            .await
            .map_err(service_status)?;
        Ok(Response::new(pb::RequeueSegmentsResponse {
            requeued,
            embeddings_requeued,
        }))
    }

    async fn get_backlog(
        &self,
        request: Request<pb::GetBacklogRequest>,
    ) -> Result<Response<pb::Backlog>, Status> {
        let tenant = tenant(&request)?;
        let backlog = self
            .service
            .backlog(&tenant)
            .await
            .map_err(service_status)?;
        Ok(Response::new(backlog_to_pb(backlog)))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let tenant = tenant(&request)?;
        let (subject, after, page_size) = parse_list_sessions(request.get_ref())?;
        let (sessions, next) = self
            .service
            .list_sessions(&tenant, subject.as_ref(), after, page_size)
            .await
            .map_err(service_status)?;
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: sessions.into_iter().map(session_info_to_pb).collect(),
            next_page_token: next.as_ref().map(session_page_token).unwrap_or_default(),
        }))
    }

    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionResponse>, Status> {
        let tenant = tenant(&request)?;
        let req = request.into_inner();
        let session = parse_session(&req.session_id, "session_id").map_err(invalid)?;
        let erased = self
            .service
            .delete(&tenant, &session)
            .await
            .map_err(service_status)?;
        Ok(Response::new(pb::DeleteSessionResponse {
            entries_deleted: erased.entries,
            segments_deleted: erased.segments,
        }))
    }

    async fn delete_subject(
        &self,
        request: Request<pb::DeleteSubjectRequest>,
    ) -> Result<Response<pb::DeleteSubjectResponse>, Status> {
        let tenant = tenant(&request)?;
        let subject = parse_subject(&request.get_ref().subject).map_err(invalid)?;
        let erased = self
            .service
            .delete_subject(&tenant, &subject)
            .await
            .map_err(service_status)?;
        Ok(Response::new(pb::DeleteSubjectResponse {
            sessions_deleted: erased.len() as u64,
            entries_deleted: erased.iter().map(|(_, e)| e.entries).sum(),
            segments_deleted: erased.iter().map(|(_, e)| e.segments).sum(),
        }))
    }

    async fn search(
        &self,
        request: Request<pb::SearchRequest>,
    ) -> Result<Response<pb::SearchResponse>, Status> {
        let tenant = tenant(&request)?;
        let (query, scope, limit) = parse_search(request.get_ref())?;
        let mode = match pb::SearchMode::try_from(request.get_ref().mode) {
            Ok(pb::SearchMode::Lexical) => SearchMode::Lexical,
            Ok(pb::SearchMode::Semantic) => SearchMode::Semantic,
            Ok(pb::SearchMode::Auto) | Err(_) => SearchMode::Auto,
        };
        let searched = self
            .service
            .search(&tenant, &scope, &query, limit, mode)
            .await
            .map_err(service_status)?;
        let leg = |l: &Leg| match l {
            Leg::Lexical => pb::SearchLeg::Lexical as i32,
            Leg::Semantic => pb::SearchLeg::Semantic as i32,
        };
        Ok(Response::new(pb::SearchResponse {
            hits: searched
                .hits
                .into_iter()
                .map(|h| pb::SearchHit {
                    session_id: h.session,
                    level: h.level,
                    first_seq: h.first_seq,
                    last_seq: h.last_seq,
                    segment_id: h.segment_id.unwrap_or(0),
                    role: h.role.map_or(pb::Role::Unspecified, role_to_pb) as i32,
                    created_at: Some(timestamp(h.created_at)),
                    score: h.score,
                    text: h.text,
                    legs: h.legs.iter().map(leg).collect(),
                    name: h.name.unwrap_or_default(),
                    occurred_at: Some(timestamp(h.occurred_at)),
                    metadata: h.metadata.into_iter().collect(),
                    similarity: h.similarity,
                    lexical_rank: h.lexical_rank,
                    semantic_rank: h.semantic_rank,
                })
                .collect(),
            legs: searched.legs.iter().map(leg).collect(),
            embedded_share: searched.embedded_share,
        }))
    }

    async fn list_entries(
        &self,
        request: Request<pb::ListEntriesRequest>,
    ) -> Result<Response<pb::ListEntriesResponse>, Status> {
        let tenant = tenant(&request)?;
        let (session, after, page_size) = parse_list_entries(request.get_ref())?;
        let page = self
            .service
            .entries(&tenant, &session, after, page_size)
            .await
            .map_err(service_status)?;
        let mut entries: Vec<pb::Entry> = page.items.into_iter().map(entry_to_pb).collect();
        let next_after = fit_page(
            &mut entries,
            self.response_limit(),
            fit_entry,
            |e| e.seq,
            page.next_after,
        );
        Ok(Response::new(pb::ListEntriesResponse {
            entries,
            next_after_seq: next_after.unwrap_or(0),
        }))
    }

    type WatchSessionStream =
        Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send + 'static>>;

    async fn watch_session(
        &self,
        request: Request<pb::WatchSessionRequest>,
    ) -> Result<Response<Self::WatchSessionStream>, Status> {
        let tenant = tenant(&request)?;
        let req = request.into_inner();
        let session = parse_session(&req.session_id, "session_id").map_err(invalid)?;
        let (events, stopping) = self
            .service
            .watch(&tenant, &session)
            .map_err(|refused| service_status(refused.into()))?;
        let (tx, rx) = mpsc::channel(WATCH_SEND_BUFFER);
        tokio::spawn(forward_events(events, stopping, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Messages a watch stream holds for a client that reads slowly; past that
/// the hub's own buffer fills and the watcher loses its oldest events.
const WATCH_SEND_BUFFER: usize = 16;

/// Feeds one watcher's stream until the session is erased (the stream ends
/// after that event), the server stops (UNAVAILABLE), or the client goes.
async fn forward_events(
    mut events: Watch,
    stopping: CancellationToken,
    tx: mpsc::Sender<Result<pb::SessionEvent, Status>>,
) {
    loop {
        let event = tokio::select! {
            () = stopping.cancelled() => {
                let mut details = ErrorDetails::new();
                details.set_error_info("SHUTTING_DOWN", ERROR_DOMAIN, HashMap::new());
                let _ = tx
                    .send(Err(Status::with_error_details(
                        Code::Unavailable,
                        "the server is stopping; watch again once it is back",
                        details,
                    )))
                    .await;
                return;
            }
            () = tx.closed() => return,
            event = events.recv() => event,
        };
        let (message, last) = match event {
            Ok(event) => {
                let last = event.kind == EventKind::Deleted;
                (event_to_pb(&event), last)
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => (gap_to_pb(missed), false),
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if tx.send(Ok(message)).await.is_err() || last {
            return;
        }
    }
}
