//! Redis: one multiplexed connection manager (reconnects by itself), start-up retries.

use std::time::Duration;

use anyhow::Context;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::retry_until;

/// Connects, waiting up to `timeout` for Redis to answer a PING.
pub async fn connect(url: &str, timeout: Duration) -> anyhow::Result<ConnectionManager> {
    let client = redis::Client::open(url).context("Invalid Redis URL")?;
    let target = client.get_connection_info().addr.to_string();
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Duration::from_secs(2))
        .set_response_timeout(Duration::from_secs(2))
        .set_number_of_retries(2);
    retry_until("Redis", &target, timeout, || async {
        let mut con = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        redis::cmd("PING").query_async::<String>(&mut con).await?;
        Ok(con)
    })
    .await
}
