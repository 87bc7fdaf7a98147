//! The load engine: HTTP/1.1 keep-alive connections over loopback, each bound to a
//! source address of its own in 127.0.0.0/8 (so per-IP limits see many clients, as on
//! real traffic); what it hears goes to a [`Recorder`].

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::record::Recorder;

/// The source address of connection `i`: 127.1.0.1, 127.1.0.2, … (never 127.0.0.1).
pub fn source_ip(i: usize) -> Ipv4Addr {
    let i = i as u32;
    Ipv4Addr::new(
        127,
        1 + (i / 62_500) as u8,
        ((i / 250) % 250) as u8,
        (1 + i % 250) as u8,
    )
}

/// One keep-alive connection from a source address of its own.
pub struct Conn {
    target: SocketAddr,
    source: Ipv4Addr,
    sender: Option<SendRequest<Full<Bytes>>>,
}

/// An answer, as the recorder needs it.
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
    pub retry_after_s: Option<u64>,
    pub latency: Duration,
    /// `X-Queue-Source: edge`: the edge answered a waiting room poll from its snapshot.
    pub from_edge: bool,
}

impl Answer {
    /// "202", "409 SOLD_OUT", "429 RATE_LIMITED", …: the status and the error code.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

impl Conn {
    pub fn new(target: SocketAddr, index: usize) -> Conn {
        Conn {
            target,
            source: source_ip(index),
            sender: None,
        }
    }

    async fn sender(&mut self) -> anyhow::Result<&mut SendRequest<Full<Bytes>>> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket
                .bind(SocketAddr::new(self.source.into(), 0))
                .with_context(|| format!("bind {}", self.source))?;
            let stream = socket
                .connect(self.target)
                .await
                .with_context(|| format!("connect {}", self.target))?;
            stream.set_nodelay(true)?;
            let (sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.sender = Some(sender);
        }
        Ok(self.sender.as_mut().expect("just set"))
    }

    /// Sends one request; reconnects once if the kept-alive connection was gone.
    pub async fn send(&mut self, req: &Request) -> anyhow::Result<Answer> {
        let mut last = None;
        let target = self.target;
        for _ in 0..2 {
            let started = Instant::now();
            let outcome = async {
                let sender = self.sender().await?;
                sender.ready().await?;
                let resp = sender.send_request(req.build(target)).await?;
                let status = resp.status().as_u16();
                let retry_after_s = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok());
                let from_edge = resp
                    .headers()
                    .get("x-queue-source")
                    .is_some_and(|v| v == "edge");
                let body = resp.into_body().collect().await?.to_bytes();
                anyhow::Ok(Answer {
                    status,
                    body,
                    retry_after_s,
                    latency: started.elapsed(),
                    from_edge,
                })
            }
            .await;
            match outcome {
                Ok(a) => return Ok(a),
                Err(e) => {
                    self.sender = None;
                    last = Some(e);
                }
            }
        }
        Err(last.expect("tried"))
    }
}

/// A request to send (cheap to clone: the body is shared).
#[derive(Clone)]
pub struct Request {
    pub method: http::Method,
    pub path: String,
    pub bearer: Option<String>,
    pub idempotency_key: Option<String>,
    /// Any other headers (the payment provider's signature).
    pub headers: Vec<(&'static str, String)>,
    pub body: Bytes,
}

impl Request {
    pub fn get(path: impl Into<String>) -> Request {
        Request {
            method: http::Method::GET,
            path: path.into(),
            bearer: None,
            idempotency_key: None,
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    pub fn post(path: impl Into<String>, body: &serde_json::Value) -> Request {
        Request {
            method: http::Method::POST,
            path: path.into(),
            bearer: None,
            idempotency_key: None,
            headers: Vec::new(),
            body: Bytes::from(body.to_string()),
        }
    }

    pub fn idempotency_key(mut self, key: &str) -> Request {
        self.idempotency_key = Some(key.to_owned());
        self
    }

    pub fn bearer(mut self, token: &str) -> Request {
        self.bearer = Some(token.to_owned());
        self
    }

    fn build(&self, target: SocketAddr) -> http::Request<Full<Bytes>> {
        let mut b = http::Request::builder()
            .method(self.method.clone())
            .uri(&self.path)
            .header("host", target.to_string());
        if !self.body.is_empty() {
            b = b.header("content-type", "application/json");
        }
        if let Some(t) = &self.bearer {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        if let Some(k) = &self.idempotency_key {
            b = b.header("idempotency-key", k.as_str());
        }
        for (name, value) in &self.headers {
            b = b.header(*name, value.as_str());
        }
        b.body(Full::new(self.body.clone())).expect("valid request")
    }
}

/// The one purchase request every closed loop sends, to the edge or to a baseline alike
/// (so the client's work per request is the same on every path): a POST with a bearer
/// token rotating over `tokens`, a fresh Idempotency-Key and a one-unit body.
pub fn purchase_maker(
    event: u64,
    category: u64,
    tokens: Vec<String>,
    connections: usize,
) -> impl Fn(usize, u64) -> Request + Send + Sync + 'static {
    purchase_to(
        format!("/api/events/{event}/orders"),
        category,
        tokens,
        connections,
    )
}

/// The same purchase request, byte for byte but the path, sent to `path`: what a
/// trivial location answers with the request a purchase costs to read.
pub fn purchase_to(
    path: String,
    category: u64,
    tokens: Vec<String>,
    connections: usize,
) -> impl Fn(usize, u64) -> Request + Send + Sync + 'static {
    let body = Bytes::from(format!(r#"{{"category_id":{category},"quantity":1}}"#));
    move |c, n| Request {
        method: http::Method::POST,
        path: path.clone(),
        bearer: Some(tokens[(n as usize * connections + c) % tokens.len()].clone()),
        idempotency_key: Some(format!("c{c}-{n}")),
        headers: Vec::new(),
        body: body.clone(),
    }
}

/// One call on a fresh connection from 127.0.0.1 (set-up and polling, not load).
pub async fn call(target: SocketAddr, req: &Request) -> anyhow::Result<Answer> {
    let mut conn = Conn {
        target,
        source: Ipv4Addr::LOCALHOST,
        sender: None,
    };
    conn.send(req).await
}

/// Every connection sends `make(conn, n)` back to back until `duration` is over; the
/// answers per second and the recorder.
pub async fn closed_loop<F>(
    target: SocketAddr,
    connections: usize,
    duration: Duration,
    make: F,
) -> anyhow::Result<(f64, Recorder)>
where
    F: Fn(usize, u64) -> Request + Send + Sync + 'static,
{
    closed_loop_over(&[target], connections, duration, make).await
}

/// [`closed_loop`] with connection `c` to `targets[c % len]` (several edges).
pub async fn closed_loop_over<F>(
    targets: &[SocketAddr],
    connections: usize,
    duration: Duration,
    make: F,
) -> anyhow::Result<(f64, Recorder)>
where
    F: Fn(usize, u64) -> Request + Send + Sync + 'static,
{
    let make = std::sync::Arc::new(make);
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::with_capacity(connections);
    for c in 0..connections {
        let (make, target) = (make.clone(), targets[c % targets.len()]);
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::new(target, c);
            let mut rec = Recorder::new(started);
            let mut n = 0;
            while Instant::now() < deadline {
                match conn.send(&make(c, n)).await {
                    Ok(a) => {
                        rec.record(&a);
                    }
                    Err(_) => {
                        rec.errors += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                n += 1;
            }
            rec
        }));
    }
    let mut all = Recorder::new(started);
    for t in tasks {
        all.merge(t.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok((all.total() as f64 / elapsed, all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_addresses_are_loopback_distinct_and_never_the_usual_one() {
        let ips: std::collections::HashSet<_> = (0..70_000).map(source_ip).collect();
        assert_eq!(ips.len(), 70_000);
        assert!(
            ips.iter()
                .all(|ip| ip.is_loopback() && *ip != Ipv4Addr::LOCALHOST)
        );
    }
}
