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
    /// The user's latest purchase in the event, if any.
    pub async fn status_of(
        &self,
        event_id: EventId,
        user_id: UserId,
    ) -> anyhow::Result<Option<PurchaseStatus>> {
        let buckets = match self.events.get(event_id.0).await? {
            Some(event) => event.buckets,
            None => 1,
        };
        let bucket = crate::keys::Bucket::of_buyer(event_id, buckets, user_id);
        let mut redis = self.redis.clone();
        let value: Option<String> = redis::cmd("HGET")
            .arg(self.keys.purchase_status(bucket))
            .arg(user_id)
            .query_async(&mut redis)
            .await?;
        value.as_deref().map(PurchaseStatus::parse).transpose()
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
