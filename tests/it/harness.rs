//! One helper per boundary: an in-process server on an ephemeral port with
//! its own data directory, and the generated client connected to it.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use archivist::config::Config;
use archivist::pb;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    pub addr: SocketAddr,
    pub client: archivist::client::Client,
    data_dir: std::path::PathBuf,
    /// The data directory, owned here unless the server shares another's.
    dir: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    pub async fn start() -> TestServer {
        TestServer::start_with(|_| {}).await
    }

    /// Starts a server on a fresh data directory after `adjust` has its say
    /// over the configuration.
    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config {
            data_dir: dir.path().to_owned(),
            ..Config::default()
        };
        config.reconciler.interval = Duration::from_millis(200);
        adjust(&mut config);
        TestServer::start_in(dir, config, None).await
    }

    /// Starts a server on `dir` (which may hold an earlier server's data),
    /// with a provider key if given, as if read from its variable.
    pub async fn start_in(dir: tempfile::TempDir, config: Config, key: Option<&str>) -> TestServer {
        let mut server = TestServer::start_at(dir.path(), config, key).await;
        server.dir = Some(dir);
        server
    }

    /// Starts a server with a provider key, as if read from its variable.
    pub async fn start_with_key(key: &str, adjust: impl FnOnce(&mut Config)) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::default();
        config.reconciler.interval = Duration::from_millis(200);
        adjust(&mut config);
        TestServer::start_in(dir, config, Some(key)).await
    }

    /// Starts a server on a data directory that a backfill may use at the
    /// same time (a second worker on one database).
    pub async fn start_at(data_dir: &Path, mut config: Config, key: Option<&str>) -> TestServer {
        crate::logs::capture();
        config.data_dir = data_dir.to_owned();
        let key = key.map(str::to_owned);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            archivist::server::run_with_key(config, key, listener, async {
                let _ = stopped.await;
            })
            .await
            .expect("server runs");
        });
        let client = archivist::client::connect(&format!("http://{addr}"))
            .await
            .expect("connect");
        TestServer {
            addr,
            client,
            data_dir: data_dir.to_owned(),
            dir: None,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the server gracefully and hands back its data directory.
    pub async fn stop(mut self) -> tempfile::TempDir {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task");
        }
        self.dir
            .take()
            .expect("the server owned its data directory")
    }

    pub async fn append(&self, session: &str, texts: &[&str]) -> pb::AppendEntriesResponse {
        self.client
            .clone()
            .append_entries(append_request(session, texts))
            .await
            .expect("append")
            .into_inner()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub async fn close(
        &self,
        session: &str,
        wait: bool,
    ) -> Result<pb::CloseSegmentResponse, tonic::Status> {
        self.client
            .clone()
            .close_segment(pb::CloseSegmentRequest {
                session_id: session.to_owned(),
                wait,
            })
            .await
            .map(tonic::Response::into_inner)
    }

    /// RequeueSegments over a session ("" for all); returns the count.
    pub async fn requeue(&self, session: &str, include_parked: bool) -> u64 {
        self.client
            .clone()
            .requeue_segments(pb::RequeueSegmentsRequest {
                session_id: session.to_owned(),
                segment_ids: Vec::new(),
                include_parked,
            })
            .await
            .expect("requeue")
            .into_inner()
            .requeued
    }

    pub async fn segment(&self, id: u64) -> pb::Segment {
        self.client
            .clone()
            .get_segment(pb::GetSegmentRequest { segment_id: id })
            .await
            .expect("get segment")
            .into_inner()
    }

    pub async fn backlog(&self) -> pb::Backlog {
        self.client
            .clone()
            .get_backlog(pb::GetBacklogRequest {})
            .await
            .expect("backlog")
            .into_inner()
    }

    pub async fn segments(&self, session: &str) -> Vec<pb::Segment> {
        list_segments(&mut self.client.clone(), session).await
    }

    pub async fn context(&self, session: &str, max_tokens: u32) -> pb::GetContextResponse {
        self.try_context(session, max_tokens)
            .await
            .expect("context")
    }

    pub async fn try_context(
        &self,
        session: &str,
        max_tokens: u32,
    ) -> Result<pb::GetContextResponse, tonic::Status> {
        self.client
            .clone()
            .get_context(pb::GetContextRequest {
                session_id: session.to_owned(),
                max_tokens,
                query: String::new(),
                min_similarity: None,
            })
            .await
            .map(tonic::Response::into_inner)
    }
}

/// Closes the open segment of `session` through `client`, not waiting for
/// its recap; the segment it closed.
pub async fn close_now(client: &archivist::client::Client, session: &str) -> pb::Segment {
    client
        .clone()
        .close_segment(pb::CloseSegmentRequest {
            session_id: session.to_owned(),
            wait: false,
        })
        .await
        .expect("close")
        .into_inner()
        .segment
        .expect("a segment closed")
}

/// Every node of `session` at `levels`, through every page.
pub async fn levels(server: &TestServer, session: &str, levels: Vec<u32>) -> Vec<pb::Segment> {
    list_segments_at(&mut server.client.clone(), session, levels).await
}

/// Every segment of `session` ("" for all), through every page.
pub async fn list_segments(
    client: &mut archivist::client::Client,
    session: &str,
) -> Vec<pb::Segment> {
    list_segments_at(client, session, Vec::new()).await
}

/// Every node of `session` ("" for all) at `levels` (empty: level 1),
/// through every page.
pub async fn list_segments_at(
    client: &mut archivist::client::Client,
    session: &str,
    levels: Vec<u32>,
) -> Vec<pb::Segment> {
    let mut out = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_segments(pb::ListSegmentsRequest {
                session_id: session.to_owned(),
                levels: levels.clone(),
                page_size: 100,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        out.extend(page.segments);
        if page.next_page_token.is_empty() {
            return out;
        }
        token = page.next_page_token;
    }
}

pub fn entry(text: &str) -> pb::NewEntry {
    pb::NewEntry {
        client_entry_id: String::new(),
        role: pb::Role::User.into(),
        content: text.to_owned(),
        ..Default::default()
    }
}

pub fn append_request(session: &str, texts: &[&str]) -> pb::AppendEntriesRequest {
    pb::AppendEntriesRequest {
        session_id: session.to_owned(),
        entries: texts.iter().map(|t| entry(t)).collect(),
        ..Default::default()
    }
}

/// The raw entries of a context, as (seq, content).
pub fn context_entries(ctx: &pb::GetContextResponse) -> Vec<(u64, String)> {
    ctx.items
        .iter()
        .filter_map(|i| match &i.item {
            Some(pb::context_item::Item::Entry(e)) => Some((e.seq, e.content.clone())),
            _ => None,
        })
        .collect()
}

/// The ErrorInfo reason of a failed call ("" when it has none).
/// The session's transcript (ListEntries' first 100 entries); empty when
/// there is no such session.
pub async fn transcript(server: &TestServer, session: &str) -> Vec<pb::Entry> {
    server
        .client
        .clone()
        .list_entries(pb::ListEntriesRequest {
            session_id: session.to_owned(),
            after_seq: 0,
            page_size: 100,
        })
        .await
        .map(|r| r.into_inner().entries)
        .unwrap_or_default()
}

pub fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default()
}

pub fn state(seg: &pb::Segment) -> pb::SegmentState {
    pb::SegmentState::try_from(seg.state).expect("known state")
}

/// Polls `check` every 20 ms until it holds or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
