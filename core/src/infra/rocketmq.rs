//! Is RocketMQ up? Asks a name server for the cluster's brokers, then asks each broker
//! for its runtime info, over RocketMQ's remoting protocol (JSON headers), which the
//! rocketmq-rust and the Apache brokers both serve.
//!
//! Frame: `i32 total_len | i32 (serialize_type << 24 | header_len) | header | body`,
//! big-endian, `total_len` counting everything after itself.

use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Request codes of the remoting protocol used here.
const GET_BROKER_CLUSTER_INFO: i32 = 106;
const GET_BROKER_RUNTIME_INFO: i32 = 28;
const SUCCESS: i64 = 0;
/// Larger answers than this are not a healthy broker's.
const MAX_FRAME: usize = 16 << 20;

/// Probes the name servers (`;`-separated) and every broker they list; returns the
/// brokers' addresses when all answer.
pub async fn probe(namesrv_addrs: &str, timeout: Duration) -> anyhow::Result<Vec<String>> {
    tokio::time::timeout(timeout, probe_inner(namesrv_addrs))
        .await
        .with_context(|| format!("no answer within {} ms", timeout.as_millis()))?
}

async fn probe_inner(namesrv_addrs: &str) -> anyhow::Result<Vec<String>> {
    let mut last_err = None;
    for namesrv in namesrv_addrs
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match request(namesrv, GET_BROKER_CLUSTER_INFO).await {
            Ok(body) => {
                let brokers = broker_addresses(&String::from_utf8_lossy(&body));
                if brokers.is_empty() {
                    bail!("name server {namesrv} lists no broker");
                }
                for broker in &brokers {
                    request(broker, GET_BROKER_RUNTIME_INFO)
                        .await
                        .with_context(|| format!("broker {broker}"))?;
                }
                return Ok(brokers);
            }
            Err(e) => last_err = Some(e.context(format!("name server {namesrv}"))),
        }
    }
    Err(last_err.unwrap_or_else(|| anyhow::anyhow!("rocketmq.namesrv_addr lists no address")))
}

/// Sends one request without body; returns the response body if its code is SUCCESS.
async fn request(addr: &str, code: i32) -> anyhow::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(addr).await.context("connect")?;
    stream.write_all(&encode(code, 1)).await.context("send")?;
    let len = stream.read_i32().await.context("read frame length")? as usize;
    if !(4..=MAX_FRAME).contains(&len) {
        bail!("bad frame length {len}");
    }
    let mut frame = vec![0u8; len];
    stream.read_exact(&mut frame).await.context("read frame")?;
    let (header, body) = decode(&frame)?;
    let answer: i64 = header["code"].as_i64().context("response without code")?;
    if answer != SUCCESS {
        bail!(
            "answered code {answer}: {}",
            header["remark"].as_str().unwrap_or("")
        );
    }
    Ok(body.to_vec())
}

fn encode(code: i32, opaque: i32) -> Vec<u8> {
    let header = serde_json::json!({
        "code": code, "language": "RUST", "version": 0, "opaque": opaque, "flag": 0,
        "serializeTypeCurrentRPC": "JSON",
    });
    let header = serde_json::to_vec(&header).expect("plain JSON");
    let mut buf = Vec::with_capacity(8 + header.len());
    buf.extend_from_slice(&((4 + header.len()) as i32).to_be_bytes());
    buf.extend_from_slice(&(header.len() as i32).to_be_bytes()); // serialize type 0 = JSON
    buf.extend_from_slice(&header);
    buf
}

fn decode(frame: &[u8]) -> anyhow::Result<(serde_json::Value, &[u8])> {
    let mark = u32::from_be_bytes(frame[..4].try_into().expect("4 bytes"));
    if mark >> 24 != 0 {
        bail!("answer not in JSON serialization ({})", mark >> 24);
    }
    let header_len = (mark & 0x00ff_ffff) as usize;
    let rest = &frame[4..];
    if header_len > rest.len() {
        bail!("header length {header_len} past the frame");
    }
    let header = serde_json::from_slice(&rest[..header_len]).context("response header")?;
    Ok((header, &rest[header_len..]))
}

/// Every `a.b.c.d:port` in the cluster-info body. The body is JSON from one broker and
/// fastjson (integer map keys, not quite JSON) from another, so it is scanned, not parsed.
fn broker_addresses(body: &str) -> Vec<String> {
    let mut found: Vec<String> = body
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == ':'))
        .filter(|t| {
            let Some((ip, port)) = t.rsplit_once(':') else {
                return false;
            };
            ip.parse::<std::net::Ipv4Addr>().is_ok() && port.parse::<u16>().is_ok()
        })
        .map(str::to_owned)
        .collect();
    found.sort();
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_frame_decodes_back_to_its_header() {
        let frame = encode(GET_BROKER_CLUSTER_INFO, 9);
        let (header, body) = decode(&frame[4..]).unwrap();
        assert_eq!(header["code"], GET_BROKER_CLUSTER_INFO);
        assert_eq!(header["opaque"], 9);
        assert!(body.is_empty());
    }

    #[test]
    fn broker_addresses_are_found_in_json_and_fastjson_bodies() {
        let json = r#"{"brokerAddrTable":{"broker-a":{"brokerAddrs":{"0":"127.0.0.1:10911"}}}}"#;
        assert_eq!(broker_addresses(json), vec!["127.0.0.1:10911"]);
        let fastjson =
            r#"{"brokerAddrTable":{"b":{"brokerAddrs":{0:"10.0.0.2:10911",1:"10.0.0.3:10911"}}}}"#;
        assert_eq!(
            broker_addresses(fastjson),
            vec!["10.0.0.2:10911", "10.0.0.3:10911"]
        );
        assert!(broker_addresses(r#"{"brokerAddrTable":{}}"#).is_empty());
    }
}
