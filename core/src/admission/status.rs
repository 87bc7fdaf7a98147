//! `GET /api/events/{id}/orders/status`: the buyer's latest purchase in the event, or
//! (`?request_id=`) one purchase of theirs, as the reservation script and the order
//! workers record it, or its order says.

use serde::Serialize;

use super::Admission;
use crate::domain::{EventId, OrderNo, UserId};

#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "UPPERCASE")]
pub enum PurchaseStatus {
    Queued {
        request_id: String,
    },
    Created {
        order_no: String,
    },
    Failed {
        /// The purchase's number (absent from a status written before it was kept).
        #[serde(skip_serializing_if = "Option::is_none")]
        request_id: Option<String>,
        reason: String,
    },
    Cancelled {
        order_no: String,
    },
    Paid {
        order_no: String,
    },
}

impl PurchaseStatus {
    /// Parses `QUEUED:<id>`, `CREATED:<order no>`, `PAID:<order no>`,
    /// `CANCELLED:<order no>` and `FAILED:<id>:<reason>` (`FAILED:<reason>` as
    /// written before the id was kept: no reason starts with a digit).
    pub fn parse(value: &str) -> anyhow::Result<PurchaseStatus> {
        let (kind, rest) = value
            .split_once(':')
            .ok_or_else(|| anyhow::anyhow!("malformed purchase status {value:?}"))?;
        Ok(match kind {
            "QUEUED" => PurchaseStatus::Queued {
                request_id: rest.to_owned(),
            },
            "CREATED" => PurchaseStatus::Created {
                order_no: rest.to_owned(),
            },
            "FAILED" => match rest.split_once(':') {
                Some((id, reason)) if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) => {
                    PurchaseStatus::Failed {
                        request_id: Some(id.to_owned()),
                        reason: reason.to_owned(),
                    }
                }
                _ => PurchaseStatus::Failed {
                    request_id: None,
                    reason: rest.to_owned(),
                },
            },
            "CANCELLED" => PurchaseStatus::Cancelled {
                order_no: rest.to_owned(),
            },
            "PAID" => PurchaseStatus::Paid {
                order_no: rest.to_owned(),
            },
            other => anyhow::bail!("unknown purchase status {other:?}"),
        })
    }

    /// Whether `value` (a buyer's status, or a replaced purchase's own record) says the
    /// purchase numbered `request` FAILED.
    pub fn says_failed(value: &str, request: OrderNo) -> bool {
        matches!(
            PurchaseStatus::parse(value),
            Ok(s @ PurchaseStatus::Failed { .. }) if s.request() == Some(request.0.to_string().as_str())
        )
    }

    /// The number of the purchase this is the status of, when it says.
    pub fn request(&self) -> Option<&str> {
        match self {
            PurchaseStatus::Queued { request_id } => Some(request_id),
            PurchaseStatus::Created { order_no }
            | PurchaseStatus::Cancelled { order_no }
            | PurchaseStatus::Paid { order_no } => Some(order_no),
            PurchaseStatus::Failed { request_id, .. } => request_id.as_deref(),
        }
    }
}

impl Admission {
    /// The user's latest purchase in the event, if any: as Redis recorded it, or, for a
    /// sale that is over (by its window, or closed) whose keys in the buyer's bucket are gone (purged after its
    /// retirement, or lost when no pass rebuilds them any more), as the buyer's latest
    /// order says.
    pub async fn status_of(
        &self,
        event_id: EventId,
        user_id: UserId,
    ) -> anyhow::Result<Option<PurchaseStatus>> {
        let event = self.events.get_public(event_id.0).await?;
        let buckets = event.as_ref().map_or(1, |e| e.buckets);
        let bucket = crate::keys::Bucket::of_buyer(event_id, buckets, user_id);
        let mut redis = self.redis.clone();
        let value: Option<String> = redis::cmd("HGET")
            .arg(self.keys.purchase_status(bucket))
            .arg(user_id)
            .query_async(&mut redis)
            .await?;
        if let Some(value) = value {
            return PurchaseStatus::parse(&value).map(Some);
        }
        // Over by its window, or closed early (its window may run for weeks yet).
        let over = |e: &crate::catalog::EventRecord| {
            e.status == crate::catalog::EventStatus::Closed || chrono::Utc::now() >= e.sale_end
        };
        if !event.as_deref().is_some_and(over) {
            return Ok(None);
        }
        // Over: while the bucket is loaded a buyer without a status has no purchase (a
        // rebuild writes every one); once its keys are gone, the orders say.
        let loaded: bool = redis::cmd("EXISTS")
            .arg(self.keys.meta(bucket))
            .query_async(&mut redis)
            .await?;
        if loaded {
            return Ok(None);
        }
        self.order_status(event_id, user_id, None).await
    }

    /// One purchase of the user's in the event, by its number (its 202's request id, its
    /// order's number), if it is theirs and known: the buyer's status while it is their
    /// latest and not FAILED; else its order, if MySQL has one; else FAILED as the
    /// buyer's status or the purchase's own record says, or QUEUED as that record says
    /// (kept once a newer purchase replaced it, `keys::replaced_purchase`).
    ///
    /// The order wins over a record and a FAILED status: those are written for purchases
    /// that are not orders, but one can be left behind an order (a settle lost, then a
    /// rebuild whose drop of the stale entry records it FAILED; a replaced purchase paid
    /// or cancelled before its settle), and an order never stops being one.
    pub async fn purchase_status(
        &self,
        event_id: EventId,
        user_id: UserId,
        request: OrderNo,
    ) -> anyhow::Result<Option<PurchaseStatus>> {
        // Every number minted carries its buyer's low bits (`ids`): another's is not
        // theirs, and costs no read.
        if crate::ids::gene(request.0) != crate::ids::gene(user_id.0) {
            return Ok(None);
        }
        let Some(bucket) = self.buyers_bucket(event_id, user_id).await? else {
            return Ok(None);
        };
        let mut redis = self.redis.clone();
        let (latest, own): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys.purchase_status(bucket))
            .arg(user_id)
            .arg(crate::keys::replaced_purchase(user_id, request))
            .query_async(&mut redis)
            .await?;
        let wanted = request.0.to_string();
        let named = |value: Option<String>| -> anyhow::Result<Option<PurchaseStatus>> {
            let Some(value) = value else { return Ok(None) };
            let status = PurchaseStatus::parse(&value)?;
            Ok((status.request() == Some(wanted.as_str())).then_some(status))
        };
        let latest = named(latest)?;
        if latest
            .as_ref()
            .is_some_and(|s| !matches!(s, PurchaseStatus::Failed { .. }))
        {
            return Ok(latest);
        }
        let own = named(own)?;
        // Read after Redis: a record is dropped only once its order was committed.
        match self.order_status(event_id, user_id, Some(request)).await {
            Ok(Some(order)) => return Ok(Some(order)),
            Ok(None) => {}
            // MySQL away: a purchase recorded QUEUED is waiting for it still, as far as
            // anyone can tell (a FAILED may be left behind an order: it waits for MySQL).
            Err(_) if matches!(own, Some(PurchaseStatus::Queued { .. })) => return Ok(own),
            Err(e) => return Err(e),
        }
        Ok(latest.or(own))
    }

    /// The purchase the user's Idempotency-Key admitted in the event, while Redis keeps
    /// its record: across a rebuild from MySQL, not once the sale's keys are purged (a
    /// day after its retirement) or lost with Redis.
    pub async fn admitted_with_key(
        &self,
        event_id: EventId,
        user_id: UserId,
        key: &str,
    ) -> anyhow::Result<Option<OrderNo>> {
        let Some(bucket) = self.buyers_bucket(event_id, user_id).await? else {
            return Ok(None);
        };
        let mut redis = self.redis.clone();
        let record: Option<String> = redis::cmd("HGET")
            .arg(self.keys.idempotency(bucket))
            .arg(crate::keys::idempotency_field(user_id, key))
            .query_async(&mut redis)
            .await?;
        Ok(record.as_deref().and_then(crate::keys::idempotency_request))
    }

    /// The bucket whose keys hold the buyer's purchases in the event, if it is one.
    async fn buyers_bucket(
        &self,
        event_id: EventId,
        user_id: UserId,
    ) -> anyhow::Result<Option<crate::keys::Bucket>> {
        let event = self.events.get_public(event_id.0).await?;
        Ok(event.map(|e| crate::keys::Bucket::of_buyer(event_id, e.buckets, user_id)))
    }

    /// The buyer's latest order in the event (or the one numbered `only`), as the
    /// purchase status a rebuild writes for it (a refund pending reads CANCELLED), from
    /// their shard (`idx_order_user_event`).
    async fn order_status(
        &self,
        event_id: EventId,
        user_id: UserId,
        only: Option<OrderNo>,
    ) -> anyhow::Result<Option<PurchaseStatus>> {
        use crate::order_tables::{self, OrderStatus};
        use mysql_async::prelude::Queryable;
        let shard = order_tables::shard_of(user_id.0, self.preloader.shards);
        let mut conn = crate::infra::mysql::checkout(&self.preloader.mysql).await?;
        let mut params: Vec<mysql_async::Value> = vec![user_id.0.into(), event_id.0.into()];
        let one = only.map_or("", |n| {
            params.push(n.0.into());
            " AND order_no = ?"
        });
        let row: Option<(u64, String)> = conn
            .exec_first(
                format!(
                    "SELECT order_no, status FROM {} WHERE user_id = ? AND event_id = ?{one} \
                     ORDER BY order_no DESC LIMIT 1",
                    order_tables::orders(shard)
                ),
                params,
            )
            .await?;
        let Some((order_no, status)) = row else {
            return Ok(None);
        };
        let word = crate::preload::snapshot::status_word(OrderStatus::parse(&status)?);
        PurchaseStatus::parse(&format!("{word}:{order_no}")).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_parse_and_serialise_as_documented() {
        let s = PurchaseStatus::parse("CREATED:123").unwrap();
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"status": "CREATED", "order_no": "123"})
        );
        let s = PurchaseStatus::parse("QUEUED:9").unwrap();
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"status": "QUEUED", "request_id": "9"})
        );
        let s = PurchaseStatus::parse("FAILED:deadline passed").unwrap();
        assert_eq!(
            s,
            PurchaseStatus::Failed {
                request_id: None,
                reason: "deadline passed".into()
            }
        );
        assert_eq!(s.request(), None);
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"status": "FAILED", "reason": "deadline passed"})
        );
        let s = PurchaseStatus::parse("FAILED:42:not persisted within 1 s").unwrap();
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"status": "FAILED", "request_id": "42",
                "reason": "not persisted within 1 s"})
        );
        assert_eq!(s.request(), Some("42"));
        let s = PurchaseStatus::parse("FAILED:4x:odd").unwrap();
        assert_eq!(s.request(), None, "{s:?}");
        assert_eq!(
            PurchaseStatus::parse("PAID:7").unwrap().request(),
            Some("7")
        );
        assert!(PurchaseStatus::says_failed("FAILED:42:x", OrderNo(42)));
        for other in [
            "FAILED:43:x",
            "FAILED:x",
            "QUEUED:42",
            "CREATED:42",
            "FAILED:42",
        ] {
            assert!(!PurchaseStatus::says_failed(other, OrderNo(42)), "{other}");
        }
        let s = PurchaseStatus::parse("CANCELLED:77").unwrap();
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"status": "CANCELLED", "order_no": "77"})
        );
        assert!(PurchaseStatus::parse("WHAT:1").is_err());
        assert!(PurchaseStatus::parse("QUEUED").is_err());
    }
}
