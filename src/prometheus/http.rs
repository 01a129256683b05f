//! The scrape endpoint of `dockhand run --metrics-bind`: `GET /metrics` answers the rendered
//! metrics; any other path is 404 and any other method 405. One request per connection
//! (`Connection: close`), a request head of at most [`MAX_HEAD`] bytes read within
//! [`HEAD_TIMEOUT`]. That is all a Prometheus scrape needs, so no HTTP server crate is pulled
//! into builds without the dashboard (the `ui` feature's axum serves the dashboard's own
//! `/metrics`).

use super::MetricsHandle;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The longest request head read.
const MAX_HEAD: usize = 8 * 1024;
/// How long a client has to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// What a failed `accept` waits before the next (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The content type of the Prometheus text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Serves `GET /metrics` from `handle` on `listener` until the task is dropped or aborted;
/// each connection is answered on a task of its own.
pub async fn serve(listener: TcpListener, handle: MetricsHandle) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let handle = handle.clone();
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &handle).await {
                        tracing::debug!(error = %e, "metrics connection");
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

/// Reads one request head and writes the answer.
async fn answer(mut stream: TcpStream, handle: &MetricsHandle) -> std::io::Result<()> {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await {
        Ok(head) => head?,
        Err(_) => return Ok(()),
    };
    let (status, extra, body) = respond(&head, handle);
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    if !head.starts_with("HEAD ") {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

/// The status line, extra headers and body for a request head.
fn respond(head: &str, handle: &MetricsHandle) -> (&'static str, &'static str, String) {
    let mut parts = head.split_ascii_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return (
            "405 Method Not Allowed",
            "Allow: GET, HEAD\r\n",
            "only GET /metrics\n".into(),
        );
    }
    if path != "/metrics" {
        return ("404 Not Found", "", "metrics are at /metrics\n".into());
    }
    ("200 OK", "", handle.render())
}

/// The request head (up to the blank line, or [`MAX_HEAD`] bytes), as text.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while buf.len() < MAX_HEAD && !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}
