//! The payment provider, simulated: `pay` signs a callback the way the provider does and
//! posts it, on time, late or several times; `serve` is the provider's payment page for
//! the browser app — the buyer confirms (or declines) there, the simulator signs and
//! posts the callback, then sends the browser back to the shop. It signs for any order
//! it is asked to, which is why it is a tool of its own on a loopback port, never part
//! of the product nor reachable through the edge.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use stampede_core::lifecycle::pay::{Callback, SIGNATURE_HEADER, sign};

pub struct PaySim {
    /// e.g. http://127.0.0.1:8080/api/payments/callback
    pub url: String,
    pub secret: String,
    pub order_no: String,
    pub amount_cents: u64,
    pub provider_txn_id: String,
    pub times: u32,
    pub after: Duration,
}

/// Posts the signed callback `times` times, `after` a wait; prints each answer.
pub async fn run(sim: PaySim) -> anyhow::Result<()> {
    let callback = Callback {
        provider_txn_id: sim.provider_txn_id.clone(),
        order_no: sim.order_no.clone(),
        amount_cents: sim.amount_cents,
    };
    tokio::time::sleep(sim.after).await;
    for attempt in 1..=sim.times {
        let (status, answer) = post_callback(&sim.url, sim.secret.trim(), &callback).await?;
        println!("callback {attempt}/{}: {status} {answer}", sim.times);
    }
    Ok(())
}

/// Signs `callback` with `secret` and posts it to `url`: the status and the body.
pub async fn post_callback(
    url: &str,
    secret: &str,
    callback: &Callback,
) -> anyhow::Result<(http::StatusCode, String)> {
    let uri: http::Uri = url.parse().context("invalid callback URL")?;
    let (Some(host), Some(port)) = (uri.host(), uri.port_u16().or(Some(80))) else {
        bail!("the callback URL needs a host")
    };
    let body = serde_json::to_vec(callback)?;
    let signature = sign(secret.as_bytes(), &body);
    let stream = tokio::net::TcpStream::connect((host, port))
        .await
        .with_context(|| format!("connect {host}:{port}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = http::Request::post(uri.path())
        .header(http::header::HOST, host)
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(SIGNATURE_HEADER, &signature)
        .body(Full::new(Bytes::from(body)))?;
    let resp = sender
        .send_request(req)
        .await
        .context("post the callback")?;
    let status = resp.status();
    let answer = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&answer).into_owned()))
}

/// Delivers `callback` as a provider does: again, the same transaction, while the shop
/// answers 5xx or not at all (the shop may have applied it and not finished: a repeat is
/// how it finishes), up to five deliveries 0.25, 0.5, 1 and 2 s apart. The last answer.
async fn deliver(
    url: &str,
    secret: &str,
    callback: &Callback,
) -> anyhow::Result<(http::StatusCode, String)> {
    let mut pause = Duration::from_millis(250);
    for _ in 1..5 {
        match post_callback(url, secret, callback).await {
            Ok((status, answer)) if !status.is_server_error() => return Ok((status, answer)),
            Ok((status, answer)) => {
                tracing::warn!(order_no = callback.order_no, %status, answer, "payment callback not taken; delivering again")
            }
            Err(e) => {
                tracing::warn!(
                    order_no = callback.order_no,
                    error = format!("{e:#}"),
                    "payment callback failed; delivering again"
                )
            }
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
    post_callback(url, secret, callback).await
}

/// The payment page's server.
pub struct PageServer {
    pub listen: SocketAddr,
    pub secret: String,
    /// Where callbacks go, e.g. http://127.0.0.1:8080/api/payments/callback
    pub callback_url: String,
    /// The shop's origin, e.g. http://127.0.0.1:8080: the browser goes back to a path there.
    pub app_origin: String,
}

/// Serves `/paysim/pay` (the page and its form) and `/paysim/health` until the process ends.
pub async fn serve(server: PageServer) -> anyhow::Result<()> {
    if !server.listen.ip().is_loopback() {
        bail!(
            "the simulator signs payments for anyone who reaches it: it listens on loopback only, not {}",
            server.listen
        );
    }
    let listener = tokio::net::TcpListener::bind(server.listen)
        .await
        .with_context(|| format!("listen on {}", server.listen))?;
    let server = Arc::new(server);
    loop {
        let (stream, _) = listener.accept().await?;
        let server = server.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let server = server.clone();
                async move { Ok::<_, Infallible>(page(&server, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

type PageResponse = http::Response<Full<Bytes>>;

/// The page's outcome of a callback the shop took (2xx), from its answer: "paid";
/// "refund_pending" when the order was no longer payable (cancelled at its deadline
/// meanwhile, or paid already); for a DUPLICATE (a delivery again after an answer lost
/// on the way: the edge's 502, a cut connection), what the first one was recorded as;
/// anything else, "unconfirmed" (the order page shows what the shop holds).
fn taken(answer: &str) -> &'static str {
    let answer: serde_json::Value = serde_json::from_str(answer).unwrap_or_default();
    match (answer["result"].as_str(), answer["recorded"].as_str()) {
        (Some("PAID"), _) | (Some("DUPLICATE"), Some("PAID")) => "paid",
        (Some("REFUND_PENDING"), _) | (Some("DUPLICATE"), Some("REFUND_PENDING")) => {
            "refund_pending"
        }
        _ => "unconfirmed",
    }
}

fn respond(status: http::StatusCode, content_type: &str, body: String) -> PageResponse {
    http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

async fn page(server: &PageServer, req: http::Request<hyper::body::Incoming>) -> PageResponse {
    use http::{Method, StatusCode};
    // Loopback is no defence against the buyer's own browser: a page from elsewhere
    // could post the form (so a POST must come from this page's own origin) or reach it
    // by a name rebound to 127.0.0.1 (so the Host must be this address).
    let port = server.listen.port();
    let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    let ours =
        |host: &str| host == format!("127.0.0.1:{port}") || host == format!("localhost:{port}");
    if !header(http::header::HOST).is_some_and(ours) {
        return respond(
            StatusCode::MISDIRECTED_REQUEST,
            "text/plain",
            "not this host".into(),
        );
    }
    if req.method() == Method::POST
        && !header(http::header::ORIGIN)
            .and_then(|o| o.strip_prefix("http://"))
            .is_some_and(ours)
    {
        return respond(
            StatusCode::FORBIDDEN,
            "text/plain",
            "only this page may post the form".into(),
        );
    }
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, "/paysim/health") => respond(StatusCode::OK, "text/plain", "ok".into()),
        (Method::GET, "/paysim/pay") => {
            let form = parse_form(req.uri().query().unwrap_or(""));
            match PayForm::from_pairs(&form) {
                Ok(f) => respond(StatusCode::OK, "text/html; charset=utf-8", f.html()),
                Err(e) => respond(StatusCode::BAD_REQUEST, "text/plain", e),
            }
        }
        (Method::POST, "/paysim/pay") => {
            let body = match http_body_util::Limited::new(req.into_body(), 4096)
                .collect()
                .await
            {
                Ok(b) => b.to_bytes(),
                Err(_) => {
                    return respond(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "text/plain",
                        "too large".into(),
                    );
                }
            };
            let pairs = parse_form(&String::from_utf8_lossy(&body));
            let f = match PayForm::from_pairs(&pairs) {
                Ok(f) => f,
                Err(e) => return respond(StatusCode::BAD_REQUEST, "text/plain", e),
            };
            let declined = pairs.iter().any(|(k, v)| k == "action" && v == "decline");
            let outcome = if declined {
                "declined".to_owned()
            } else {
                let callback = Callback {
                    provider_txn_id: format!("sim-{}", rand::random::<u64>()),
                    order_no: f.order_no.clone(),
                    amount_cents: f.amount_cents,
                };
                match deliver(&server.callback_url, server.secret.trim(), &callback).await {
                    Ok((status, answer)) if status.is_success() => {
                        tracing::info!(order_no = f.order_no, answer, "payment callback accepted");
                        taken(&answer).to_owned()
                    }
                    Ok((status, answer)) if status.is_client_error() => {
                        tracing::warn!(order_no = f.order_no, %status, answer, "payment callback refused");
                        "refused".to_owned()
                    }
                    // Still 5xx, or no answer, after every delivery: the shop may have
                    // applied it (a 503 after the commit says so), so neither "paid"
                    // nor "refused": the order page shows what the shop holds.
                    Ok((status, answer)) => {
                        tracing::warn!(order_no = f.order_no, %status, answer, "payment callback not confirmed");
                        "unconfirmed".to_owned()
                    }
                    Err(e) => {
                        tracing::warn!(
                            order_no = f.order_no,
                            error = format!("{e:#}"),
                            "payment callback not confirmed"
                        );
                        "unconfirmed".to_owned()
                    }
                }
            };
            let sep = if f.return_to.contains('?') { '&' } else { '?' };
            let location = format!("{}{}{sep}payment={outcome}", server.app_origin, f.return_to);
            // return_to is checked to be visible ASCII, so this is a valid header value.
            match http::HeaderValue::from_str(&location) {
                Ok(location) => http::Response::builder()
                    .status(StatusCode::SEE_OTHER)
                    .header(http::header::LOCATION, location)
                    .body(Full::new(Bytes::new()))
                    .unwrap_or_else(|_| {
                        respond(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            "text/plain",
                            "bad redirect".into(),
                        )
                    }),
                Err(_) => respond(
                    StatusCode::BAD_REQUEST,
                    "text/plain",
                    "return: not a valid path".into(),
                ),
            }
        }
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found".into()),
    }
}

struct PayForm {
    order_no: String,
    amount_cents: u64,
    /// A path on the shop's own site (never another host): see `shop_path`.
    return_to: String,
}

impl PayForm {
    fn from_pairs(pairs: &[(String, String)]) -> Result<PayForm, String> {
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        let order_no = get("order_no")
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .ok_or("order_no: digits")?
            .to_owned();
        let amount_cents = get("amount_cents")
            .and_then(|v| v.parse().ok())
            .ok_or("amount_cents: a number")?;
        let return_to = get("return").unwrap_or("/");
        if !shop_path(return_to) {
            return Err("return: a path on the shop's site".into());
        }
        Ok(PayForm {
            order_no,
            amount_cents,
            return_to: return_to.to_owned(),
        })
    }

    fn html(&self) -> String {
        let amount = format!("{}.{:02}", self.amount_cents / 100, self.amount_cents % 100);
        let hidden = format!(
            "<input type=hidden name=order_no value=\"{}\"><input type=hidden name=amount_cents value=\"{}\">\
             <input type=hidden name=return value=\"{}\">",
            self.order_no,
            self.amount_cents,
            escape(&self.return_to)
        );
        format!(
            "<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content=\"width=device-width, initial-scale=1\">\
             <title>SimPay — pay {amount}</title><style>\
             body{{font:16px/1.5 system-ui,sans-serif;background:#eef1f6;margin:0;display:flex;min-height:100vh;align-items:center;justify-content:center}}\
             .card{{background:#fff;border-radius:12px;box-shadow:0 4px 20px #0002;padding:2rem 2.5rem;max-width:24rem;width:100%}}\
             h1{{font-size:1.1rem;color:#555;margin:0 0 1rem}} .amount{{font-size:2.4rem;font-weight:700;margin:.5rem 0}}\
             .muted{{color:#777;font-size:.9rem}} button{{font:inherit;padding:.7rem 1.2rem;border-radius:8px;border:0;cursor:pointer;margin-right:.5rem}}\
             .pay{{background:#1a7f37;color:#fff}} .decline{{background:#eee}}</style></head><body><div class=card>\
             <h1>SimPay · payment provider simulator</h1><div class=muted>Order {}</div><div class=amount>€ {amount}</div>\
             <p class=muted>This page stands in for a real payment provider. Paying sends Stampede a signed callback.</p>\
             <form method=post action=/paysim/pay>{hidden}<button class=pay name=action value=pay>Pay € {amount}</button>\
             <button class=decline name=action value=decline>Decline</button></form></div></body></html>",
            self.order_no
        )
    }
}

/// A path on the shop's own origin, and nothing a browser could read as another host:
/// one leading `/` (not `//` nor `/\`, which browsers read as `//`), then visible ASCII
/// without a backslash — so no control character (a header split) and no scheme trick.
fn shop_path(p: &str) -> bool {
    let b = p.as_bytes();
    b.first() == Some(&b'/')
        && !matches!(b.get(1), Some(b'/' | b'\\'))
        && b.iter().all(|&c| c.is_ascii_graphic() && c != b'\\')
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `a=1&b=x%20y` → pairs, '+' as space, percent-decoded (form_urlencoded).
fn parse_form(s: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(s.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_callback_reads_as_what_the_shop_recorded() {
        for (answer, outcome) in [
            (r#"{"result":"PAID","order_no":"1"}"#, "paid"),
            (
                r#"{"result":"REFUND_PENDING","order_no":"1"}"#,
                "refund_pending",
            ),
            (r#"{"result":"DUPLICATE","recorded":"PAID"}"#, "paid"),
            (
                r#"{"result":"DUPLICATE","recorded":"REFUND_PENDING"}"#,
                "refund_pending",
            ),
            (
                r#"{"result":"DUPLICATE","recorded":"OTHER_ORDER"}"#,
                "unconfirmed",
            ),
            (r#"{"result":"DUPLICATE"}"#, "unconfirmed"),
            (r#"{"result":"SOMETHING_NEW"}"#, "unconfirmed"),
            (r#"{"result":1}"#, "unconfirmed"),
            (r#"{"recorded":"PAID"}"#, "unconfirmed"),
            ("[]", "unconfirmed"),
            ("", "unconfirmed"),
            ("<html>ok</html>", "unconfirmed"),
        ] {
            assert_eq!(taken(answer), outcome, "{answer}");
        }
    }

    #[test]
    fn forms_decode_and_refuse_returns_to_other_sites() {
        let pairs = parse_form("order_no=42&amount_cents=1500&return=%2F%23%2Forder%2F42&x=a+b");
        assert_eq!(pairs[2], ("return".into(), "/#/order/42".into()));
        assert_eq!(pairs[3], ("x".into(), "a b".into()));
        let f = PayForm::from_pairs(&pairs).unwrap();
        assert_eq!((f.order_no.as_str(), f.amount_cents), ("42", 1500));
        for bad in [
            "return=%2F%2Fevil.example",
            "return=http://evil.example",
            "return=%2F%5Cevil.example",
            "return=/%5Cevil.example",
            "return=%5C%5Cevil.example",
            "return=/a%0Ab",
            "return=/a%0D%0ASet-Cookie:x=1",
            "return=/a%00",
            "return=/a%20b",
            "return=/%C3%A9",
            "return=",
            "return=evil.example",
        ] {
            let p = parse_form(&format!("order_no=1&amount_cents=1&{bad}"));
            assert!(PayForm::from_pairs(&p).is_err(), "{bad}");
        }
        assert!(PayForm::from_pairs(&parse_form("order_no=1x&amount_cents=1")).is_err());
        assert_eq!(parse_form("a=%zz%4"), vec![("a".into(), "%zz%4".into())]);
        assert_eq!(
            parse_form("a=%41"),
            vec![("a".into(), "A".into())],
            "a last escape too"
        );
    }
}
