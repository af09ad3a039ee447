//! What any gRPC tool relies on: health and server reflection (v1 and the
//! v1alpha that grpcurl 1.8 speaks).

use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::{v1, v1alpha};

use crate::harness::TestServer;

#[tokio::test]
async fn health_reports_serving() {
    let server = TestServer::start().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel);
    for service in ["", "archivist.v1.Archivist"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("health check")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }
}

#[tokio::test]
async fn reflection_lists_the_services_in_both_versions() {
    let server = TestServer::start().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");

    let mut alpha = v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut stream = alpha
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection v1alpha")
        .into_inner();
    let reply = stream.next().await.expect("a reply").expect("ok");
    let names: Vec<String> = match reply.message_response {
        Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reply {other:?}"),
    };
    assert!(
        names.contains(&"archivist.v1.Archivist".to_owned()),
        "{names:?}"
    );
    assert!(
        names.contains(&"grpc.health.v1.Health".to_owned()),
        "{names:?}"
    );

    // The error details' types resolve too, so tools can print them.
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
                "google.rpc.BadRequest".to_owned(),
            ),
        ),
    };
    let mut stream = alpha
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection v1alpha")
        .into_inner();
    let reply = stream.next().await.expect("a reply").expect("ok");
    assert!(
        matches!(
            reply.message_response,
            Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(_))
        ),
        "{:?}",
        reply.message_response
    );

    let mut v1 = v1::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1::server_reflection_request::MessageRequest::FileContainingSymbol(
                "archivist.v1.Archivist".to_owned(),
            ),
        ),
    };
    let mut stream = v1
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection v1")
        .into_inner();
    let reply = stream.next().await.expect("a reply").expect("ok");
    match reply.message_response {
        Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(f)) => {
            assert!(!f.file_descriptor_proto.is_empty());
        }
        other => panic!("unexpected reply {other:?}"),
    }
}
