//! Payment: the provider calls back with a body it signed (HMAC-SHA256 of the raw body,
//! hex, in `X-Signature`). Verified, the amount checked, and applied once per provider
//! transaction id: the order goes UNPAID → PAID with a conditional update and its seats
//! locked → sold in MySQL and Redis. A payment for an order already cancelled (or paid
//! by another transaction) is recorded as REFUND_PENDING, never silently accepted.
//! Pay and cancel both lock the order's row first, so exactly one of them wins.

use std::sync::LazyLock;
use std::time::Duration;

use crate::infra::redis::Redis;
use anyhow::Context;
use backon::Retryable;
use hmac::{Hmac, Mac};
use mysql_async::prelude::*;
use mysql_async::{Pool, TxOpts};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::{Lifecycle, OrderView, load_in};
use crate::domain::{EventId, OrderNo};
use crate::infra::backoff;
use crate::keys::Keys;
use crate::order_tables::{self, OrderStatus, shard_of_order};

static SOLD: LazyLock<redis::Script> =
    LazyLock::new(|| crate::infra::redis::script(include_str!("../../../lua/redis/sold.lua")));

/// `sold.lua`'s answer: seats moved to sold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sold(pub u64);

/// The header the provider's signature travels in.
pub const SIGNATURE_HEADER: &str = "x-signature";

/// Hex HMAC-SHA256 of `body` with `secret`: the provider's signature (and pay-sim's).
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    hex::encode(mac_of(secret, body).finalize().into_bytes())
}

fn mac_of(secret: &[u8], body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    mac
}

/// Whether `signature` (hex, either case) is `body`'s; compared in constant time.
fn verified(secret: &[u8], body: &[u8], signature: Option<&str>) -> bool {
    signature
        .and_then(|s| hex::decode(s.trim()).ok())
        .is_some_and(|sig| mac_of(secret, body).verify_slice(&sig).is_ok())
}

/// What the provider posts.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Callback {
    pub provider_txn_id: String,
    /// As a string: order numbers are 63-bit.
    pub order_no: String,
    pub amount_cents: u64,
}

/// What became of a callback.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Applied {
    /// The order is PAID now.
    Paid,
    /// The order was cancelled or paid already: the money is to be refunded.
    RefundPending,
    /// This provider transaction was seen before; nothing changed. What it was
    /// recorded as the first time, so a provider whose first answer was lost learns it.
    Duplicate(Recorded),
}

/// What a provider transaction was recorded as when it was first delivered.
#[derive(Debug, PartialEq, Eq, Clone, Copy, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Recorded {
    /// It paid this order.
    Paid,
    /// It came for this order no longer unpaid: the money is to be refunded.
    RefundPending,
    /// It was recorded for another order: nothing here is its doing.
    OtherOrder,
}

impl Applied {
    /// The answer's `result`.
    pub fn word(self) -> &'static str {
        match self {
            Applied::Paid => "PAID",
            Applied::RefundPending => "REFUND_PENDING",
            Applied::Duplicate(_) => "DUPLICATE",
        }
    }
}

/// Why a callback was refused.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("bad signature")]
    BadSignature,
    #[error("{0}")]
    Invalid(String),
    #[error("no order {0}")]
    NoSuchOrder(OrderNo),
    #[error("amount {got} does not match the order's {expected}")]
    AmountMismatch { got: u64, expected: u64 },
    /// Applied in MySQL (the order is PAID), but its seats and the buyer's status could
    /// not be marked in Redis: the provider is to deliver again, and the repeat marks
    /// them. Nothing else would: answered 200, the buyer's status read CREATED ("pay
    /// before the deadline") for a paid order until the sale's keys were purged.
    #[error(
        "order {0} is paid, but its seats and the buyer's status could not be marked yet; deliver this callback again"
    )]
    NotMarked(OrderNo),
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl Lifecycle {
    /// Verifies and applies one callback. Two deliveries of one transaction at the same
    /// moment both answer: the one that commits first applies it, the other sees it and
    /// answers DUPLICATE (never a 500 from the race).
    pub async fn pay(
        &self,
        secret: &[u8],
        body: &[u8],
        signature: Option<&str>,
    ) -> Result<(Applied, OrderNo), Refused> {
        if !verified(secret, body, signature) {
            return Err(Refused::BadSignature);
        }
        let cb: Callback = crate::domain::json::parse(body)
            .map_err(|e| Refused::Invalid(format!("invalid callback: {e}")))?;
        let order_no = crate::domain::ids::canonical_id(&cb.order_no)
            .map(OrderNo)
            .ok_or_else(|| Refused::Invalid("order_no is not a number".into()))?;
        // Characters, as the column (VARCHAR(128), utf8mb4) counts them.
        if cb.provider_txn_id.is_empty() || cb.provider_txn_id.chars().count() > 128 {
            return Err(Refused::Invalid(
                "provider_txn_id must be 1..=128 characters".into(),
            ));
        }
        let deadlocked = |e: &Refused| matches!(e, Refused::Unexpected(e) if server_error(e) == Some(ER_LOCK_DEADLOCK));
        // Captures references only: a copy retries, the original reads again below.
        let apply = || async {
            let mut redis = self.redis.clone();
            let (pool, keys) = (&self.mysql, &self.keys);
            apply_once(pool, &mut redis, keys, self.shards, &cb, order_no).await
        };
        let retried = || {
            apply
                .retry(
                    backoff(Duration::from_millis(10), Duration::from_millis(100))
                        .with_max_times(2),
                )
                .sleep(tokio::time::sleep)
                .when(deadlocked)
                .notify(
                    |_, _| tracing::info!(%order_no, "payment deadlocked with another; retrying"),
                )
        };
        match retried().await {
            // The same transaction inserted by a concurrent delivery that committed
            // first: read again, it is a duplicate that says what the other recorded.
            Err(Refused::Unexpected(e)) if server_error(&e) == Some(ER_DUP_ENTRY) => {
                retried().await
            }
            other => other,
        }
    }
}

const ER_DUP_ENTRY: u16 = 1062;
const ER_LOCK_DEADLOCK: u16 = 1213;

/// The MySQL server's error code behind `e`, if it is one.
fn server_error(e: &anyhow::Error) -> Option<u16> {
    match e.downcast_ref::<mysql_async::Error>()? {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

async fn apply_once(
    pool: &Pool,
    redis: &mut Redis,
    keys: &Keys,
    shards: u32,
    cb: &Callback,
    order_no: OrderNo,
) -> Result<(Applied, OrderNo), Refused> {
    let mut conn = crate::infra::mysql::checkout(pool)
        .await
        .context("Failed to get a MySQL connection")?;
    let mut tx = conn
        .start_transaction(TxOpts::default())
        .await
        .context("begin")?;
    // The order's row first: deliveries for one order take turns from here on.
    let Some(order) = load_in(&mut tx, shards, order_no, true).await? else {
        return Err(Refused::NoSuchOrder(order_no));
    };
    let seen: Option<(String, u64, u64)> = tx
        .exec_first(
            "SELECT status, order_no, amount_cents FROM payment WHERE provider_txn_id = ?",
            (&cb.provider_txn_id,),
        )
        .await
        .context("Failed to read the payment")?;
    if let Some((seen, paid_order, paid_cents)) = seen {
        tx.commit().await.context("commit")?;
        if paid_order != order_no.0 {
            tracing::error!(
                %order_no,
                recorded_for = paid_order,
                txn = cb.provider_txn_id,
                "a provider transaction id already recorded for another order: nothing applied"
            );
            return Ok((Applied::Duplicate(Recorded::OtherOrder), order_no));
        }
        if paid_cents != order.amount_cents {
            // The wrong amount, recorded for refund the first time: the same answer.
            return Err(Refused::AmountMismatch {
                got: paid_cents,
                expected: order.amount_cents,
            });
        }
        if seen == "APPLIED" && order.status == OrderStatus::Paid {
            // The first delivery's answer may have been lost after its commit, or its
            // core stopped, before the seats and the buyer's status were marked in
            // Redis (review: nothing else marks them; the buyer read CREATED — go and
            // pay — for a paid order). The provider delivers again: mark them now;
            // sold.lua changes only what is still locked or CREATED for this order.
            if let Err(e) = sold(redis, keys, &order).await {
                tracing::warn!(
                    %order_no,
                    error = format!("{e:#}"),
                    "paid before, seats still not marked sold in Redis"
                );
                return Err(Refused::NotMarked(order_no));
            }
        }
        let recorded = if seen == "APPLIED" {
            Recorded::Paid
        } else {
            Recorded::RefundPending
        };
        return Ok((Applied::Duplicate(recorded), order_no));
    }
    if cb.amount_cents != order.amount_cents {
        // Money the provider took that pays for nothing: recorded for refund (counted in
        // `refunds_pending`), the order unchanged. Before, nothing was written and the
        // money had no trace here (review).
        tx.exec_drop(
            "INSERT INTO payment (provider_txn_id, order_no, amount_cents, status) VALUES (?, ?, ?, 'REFUND_PENDING')",
            (&cb.provider_txn_id, order_no, cb.amount_cents),
        )
        .await
        .context("Failed to record the payment")?;
        tx.commit().await.context("Failed to commit the payment")?;
        tracing::warn!(
            %order_no,
            got = cb.amount_cents,
            expected = order.amount_cents,
            "payment of the wrong amount: recorded for refund"
        );
        return Err(Refused::AmountMismatch {
            got: cb.amount_cents,
            expected: order.amount_cents,
        });
    }
    let applied = if order.status == OrderStatus::Unpaid {
        let n = shard_of_order(order_no, shards);
        tx.exec_drop(
            format!(
                "UPDATE {} SET status = ?, paid_at = UTC_TIMESTAMP(3) WHERE order_no = ? AND status = ?",
                order_tables::orders(n)
            ),
            (OrderStatus::Paid, order_no, OrderStatus::Unpaid),
        )
        .await
        .context("Failed to mark the order paid")?;
        // From the order's items: stock sync may not have written its seat rows yet.
        tx.exec_drop(
            format!(
                "INSERT INTO seat (category_id, row_no, col_no, event_id, status, order_no) \
                 SELECT category_id, row_no, col_no, ?, 'SOLD', order_no FROM {} \
                 WHERE order_no = ? AND row_no IS NOT NULL AND from_station IS NULL \
                 ON DUPLICATE KEY UPDATE status = 'SOLD', order_no = VALUES(order_no)",
                order_tables::items(n)
            ),
            (order.event_id, order_no),
        )
        .await
        .context("Failed to mark the seats sold")?;
        Applied::Paid
    } else {
        Applied::RefundPending
    };
    let recorded = if applied == Applied::Paid {
        "APPLIED"
    } else {
        "REFUND_PENDING"
    };
    tx.exec_drop(
        "INSERT INTO payment (provider_txn_id, order_no, amount_cents, status) VALUES (?, ?, ?, ?)",
        (&cb.provider_txn_id, order_no, cb.amount_cents, recorded),
    )
    .await
    .context("Failed to record the payment")?;
    tx.commit().await.context("Failed to commit the payment")?;
    if applied == Applied::Paid {
        tracing::info!(%order_no, "order paid");
        if let Err(e) = sold(redis, keys, &order).await {
            // MySQL is the record. The provider's next delivery marks them (above).
            tracing::warn!(
                %order_no,
                error = format!("{e:#}"),
                "paid, but seats and status not marked in Redis: the provider is asked to deliver again"
            );
            return Err(Refused::NotMarked(order_no));
        }
    } else {
        tracing::warn!(
            %order_no,
            status = %order.status,
            "payment for an order no longer unpaid: refund pending"
        );
    }
    Ok((applied, order_no))
}

/// The seats sold and the buyer's status PAID: one call, or two when the seats are in
/// another slot than the buyer's bucket (an event of several buckets).
async fn sold(redis: &mut Redis, keys: &Keys, o: &OrderView) -> anyhow::Result<Sold> {
    let b = o.bucket();
    if b.holds_seats() {
        let moved: u64 = SOLD
            .key(keys.seats(b, o.category_id))
            .key(keys.purchase_status(b))
            .arg(&o.order_no)
            .arg(o.user_id)
            .arg(o.seats.join(","))
            .invoke_async(redis)
            .await?;
        return Ok(Sold(moved));
    }
    let home = b.seat_home();
    // No user in the seats' slot: the status is the bucket's call's.
    let moved: u64 = SOLD
        .key(keys.seats(home, o.category_id))
        .key(keys.purchase_status(home))
        .arg(&o.order_no)
        .arg("")
        .arg(o.seats.join(","))
        .invoke_async(redis)
        .await?;
    let _: u64 = SOLD
        .key(keys.stock(b))
        .key(keys.purchase_status(b))
        .arg(&o.order_no)
        .arg(o.user_id)
        .arg("")
        .invoke_async(redis)
        .await?;
    Ok(Sold(moved))
}

/// Payments of an event's orders waiting for a refund, over every shard.
pub async fn refunds_pending(pool: &Pool, shards: u32, event_id: EventId) -> anyhow::Result<u64> {
    let orders = order_tables::over_shards(
        shards,
        &format!("SELECT order_no FROM {{orders}} WHERE event_id = {event_id}"),
    );
    let mut conn = crate::infra::mysql::checkout(pool).await?;
    let n: Option<u64> = conn
        .query_first(format!(
            "SELECT COUNT(*) FROM payment WHERE status = 'REFUND_PENDING' AND order_no IN ({orders})"
        ))
        .await?;
    Ok(n.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_hex_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn only_the_bodys_own_signature_verifies() {
        let sig = sign(b"k", b"body");
        assert!(verified(b"k", b"body", Some(&sig)));
        assert!(verified(
            b"k",
            b"body",
            Some(&format!(" {} ", sig.to_uppercase()))
        ));
        assert!(!verified(b"k", b"body!", Some(&sig)));
        assert!(!verified(b"other", b"body", Some(&sig)));
        for bad in [None, Some(""), Some("zz"), Some(&sig[..10])] {
            assert!(!verified(b"k", b"body", bad), "{bad:?}");
        }
    }
}
