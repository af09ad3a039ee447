//! The MCP server proper: the tool list and the dispatch of a call to its
//! tool (`ServerHandler`), and the one connection to archivist every MCP
//! session shares (`Backend`), set up on first use and kept; tonic's
//! channel reconnects by itself once a server that went away is back.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ProtocolVersion, ResultType,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use super::args::ToolArgs;
use super::error::ToolError;
use super::recall::{self, RECALL};
use super::tools::{self, CONTEXT, FORGET, FORGET_SUBJECT, INSTRUCTIONS, LIST_SESSIONS, REMEMBER};
use crate::client::{Client, ClientOptions, connect_with};

/// The connection to archivist and what every call is bounded by.
pub(super) struct Backend {
    options: ClientOptions,
    /// The longest one gRPC call may take.
    pub(super) timeout: Duration,
    pub(super) allow_forget: bool,
    /// The most bytes one answer's text (and its structured content) may
    /// take.
    pub(super) max_answer_bytes: usize,
    client: tokio::sync::Mutex<Option<Client>>,
    tools: Vec<Tool>,
}

impl Backend {
    pub(super) fn new(
        options: ClientOptions,
        timeout: Duration,
        allow_forget: bool,
        max_answer_bytes: usize,
        client: Option<Client>,
    ) -> Backend {
        Backend {
            options,
            timeout,
            allow_forget,
            max_answer_bytes,
            client: tokio::sync::Mutex::new(client),
            tools: tools::tools(allow_forget),
        }
    }

    /// The client, connecting first if no connection was ever made.
    pub(super) async fn client(&self) -> Result<Client, ToolError> {
        let mut held = self.client.lock().await;
        if let Some(client) = held.as_ref() {
            return Ok(client.clone());
        }
        let client = connect_with(&self.options)
            .await
            .map_err(|e| ToolError::connect(&e))?;
        *held = Some(client.clone());
        Ok(client)
    }

    /// A request bounded by the call timeout.
    pub(super) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        request
    }

    pub(super) fn status(&self, status: &tonic::Status, tool: &str) -> ToolError {
        ToolError::status(status, tool, self.timeout)
    }

    pub(super) fn parse<A: ToolArgs>(&self, args: Option<JsonObject>) -> Result<A, ToolError> {
        A::parse(args).map_err(ToolError::arguments)
    }

    /// One tool call, start to end: every failure a tool error.
    pub(super) async fn call(&self, name: &str, args: Option<JsonObject>) -> CallToolResult {
        let outcome = match name {
            REMEMBER => tools::remember(self, args).await,
            RECALL => recall::recall(self, args).await,
            CONTEXT => tools::context(self, args).await,
            LIST_SESSIONS => tools::list_sessions(self, args).await,
            FORGET => tools::forget(self, args).await,
            FORGET_SUBJECT => tools::forget_subject(self, args).await,
            other => {
                let offered: Vec<&str> = self.tools.iter().map(|t| t.name.as_ref()).collect();
                Err(ToolError::no_such_tool(other, &offered))
            }
        };
        match outcome {
            Ok(result) => result,
            Err(error) => {
                tracing::debug!(tool = name, code = error.code, reason = ?error.reason, "tool call failed");
                error.into_result()
            }
        }
    }
}

/// What each MCP session is served by: a handle on the shared backend.
#[derive(Clone)]
pub(super) struct Archivist {
    backend: Arc<Backend>,
}

impl Archivist {
    pub(super) fn new(backend: Arc<Backend>) -> Archivist {
        Archivist { backend }
    }
}

impl ServerHandler for Archivist {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("archivist", env!("CARGO_PKG_VERSION"))
                    .with_title("archivist memory"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut result = ListToolsResult::with_all_items(self.backend.tools.clone());
        // From 2026-07-28 a list carries cache hints; the list never
        // changes while the process lives.
        if context
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
        {
            result.result_type = Some(ResultType::COMPLETE);
            result.ttl_ms = Some(0);
            result.cache_scope = Some(CacheScope::Public);
        }
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.backend.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(self
            .backend
            .call(&request.name, request.arguments)
            .await
            .into())
    }
}
