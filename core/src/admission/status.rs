//! `GET /api/events/{id}/orders/status`: the buyer's latest purchase in the event, as
//! the reservation script and the order workers record it.

use serde::Serialize;

use super::Admission;
use crate::domain::{EventId, UserId};

#[derive(Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "UPPERCASE")]
pub enum PurchaseStatus {
    Queued { request_id: String },
    Created { order_no: String },
    Failed { reason: String },
    Cancelled { order_no: String },
    Paid { order_no: String },
}

impl PurchaseStatus {
    /// Parses `QUEUED:<id>`, `CREATED:<order no>`, `PAID:<order no>`,
    /// `CANCELLED:<order no>` and `FAILED:<reason>`.
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
            "FAILED" => PurchaseStatus::Failed {
                reason: rest.to_owned(),
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
        self.latest_order(event_id, user_id).await
    }

    /// The buyer's latest order in the event, as the purchase status a rebuild writes for
    /// it (a refund pending reads CANCELLED), from their shard (`idx_order_user_event`).
    async fn latest_order(
        &self,
        event_id: EventId,
        user_id: UserId,
    ) -> anyhow::Result<Option<PurchaseStatus>> {
        use crate::order_tables::{self, OrderStatus};
        use mysql_async::prelude::Queryable;
        let shard = order_tables::shard_of(user_id.0, self.preloader.shards);
        let mut conn = crate::infra::mysql::checkout(&self.preloader.mysql).await?;
        let row: Option<(u64, String)> = conn
            .exec_first(
                format!(
                    "SELECT order_no, status FROM {} WHERE user_id = ? AND event_id = ? \
                     ORDER BY order_no DESC LIMIT 1",
                    order_tables::orders(shard)
                ),
                (user_id.0, event_id.0),
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
                reason: "deadline passed".into()
            }
        );
        let s = PurchaseStatus::parse("CANCELLED:77").unwrap();
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"status": "CANCELLED", "order_no": "77"})
        );
        assert!(PurchaseStatus::parse("WHAT:1").is_err());
        assert!(PurchaseStatus::parse("QUEUED").is_err());
    }
}
