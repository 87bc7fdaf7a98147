//! The core's connection limits: a stalled body gets 408, past the cap a client waits.

use std::time::Duration;

#[tokio::test]
async fn a_body_that_never_arrives_is_cut_off_with_408() {
    let app = stampede_e2e::spawn_app_with(|s| s.server.read_timeout_ms = 500).await;
    let port: u16 = app.public_url.rsplit(':').next().unwrap().parse().unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(b"POST /api/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"user")
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .expect("the core answers a stalled body")
        .ok();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("REQUEST_TIMEOUT"), "{text}");
    app.stop().await;
}

#[tokio::test]
async fn past_the_connection_cap_a_client_waits_for_a_free_one() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = stampede_e2e::spawn_app_with(|s| s.server.max_connections = 2).await;
    let port: u16 = app.public_url.rsplit(':').next().unwrap().parse().unwrap();
    let connect = || tokio::net::TcpStream::connect(("127.0.0.1", port));
    // Two idle connections hold both permits.
    let first = connect().await.unwrap();
    let _second = connect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = connect().await.unwrap(); // the kernel queues it
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let early =
        tokio::time::timeout(Duration::from_millis(500), third.read_to_end(&mut answer)).await;
    assert!(
        early.is_err(),
        "answered past the cap: {:?}",
        String::from_utf8_lossy(&answer)
    );
    // One closes: the queued connection is served.
    drop(first);
    tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut answer))
        .await
        .expect("served once a permit is free")
        .unwrap();
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    app.stop().await;
}
