//! `stampede pay-sim`: plays the payment provider for the demo and the tests — signs a
//! callback the way the provider does and posts it, on time, late or several times.

use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use crate::lifecycle::pay::{Callback, SIGNATURE_HEADER, sign};

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
    let uri: http::Uri = sim.url.parse().context("invalid --url")?;
    let (Some(host), Some(port)) = (uri.host(), uri.port_u16().or(Some(80))) else {
        bail!("--url needs a host")
    };
    let body = serde_json::to_vec(&Callback {
        provider_txn_id: sim.provider_txn_id.clone(),
        order_no: sim.order_no.clone(),
        amount_cents: sim.amount_cents,
    })?;
    let signature = sign(sim.secret.trim().as_bytes(), &body);
    tokio::time::sleep(sim.after).await;
    for attempt in 1..=sim.times {
        let stream = tokio::net::TcpStream::connect((host, port))
            .await
            .with_context(|| format!("connect {host}:{port}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let req = http::Request::post(uri.path())
            .header(http::header::HOST, host)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, &signature)
            .body(Full::new(Bytes::from(body.clone())))?;
        let resp = sender
            .send_request(req)
            .await
            .context("post the callback")?;
        let status = resp.status();
        let answer = resp.into_body().collect().await?.to_bytes();
        println!(
            "callback {attempt}/{}: {status} {}",
            sim.times,
            String::from_utf8_lossy(&answer)
        );
    }
    Ok(())
}
