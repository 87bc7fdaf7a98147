//! A close or a reopen writes MySQL first, then Redis (every metadata hash and the sales
//! index, `Preloader::set_sale_status`). When the Redis write fails the admin hears
//! 503 and may send it again; until then, or if nobody does, Redis says the other
//! status: a sale closed in MySQL stays open at the edges (the core refuses its buyers
//! from its own record, but the waiting room's turns run on), a reopened one stays
//! closed. A healing pass finds the difference and writes MySQL's status again.

use chrono::Utc;

use super::Reconciler;
use crate::catalog::{self, EventRecord, EventStatus};
use crate::domain::EventId;
use crate::preload::sales_entry;

/// Whether Redis says another status than `event`'s: a loaded metadata hash whose status
/// is not the one `entry` (the event's sales-index entry) starts with, or a sales-index
/// entry that is not `entry`. Pure, for the tests.
pub(super) fn differs(entry: &str, metas: &[Option<String>], listed: Option<&str>) -> bool {
    let want = entry.split(':').next().unwrap_or_default();
    metas.iter().flatten().any(|status| status != want) || listed.is_some_and(|l| l != entry)
}

impl Reconciler {
    /// MySQL's status written again where Redis says another (see the module's notes);
    /// the action taken, if one was. A published sale whose window is over is left as
    /// Redis has it: its retirement closes its keys. The record written is read again
    /// just before (a close or reopen since the pass began is the next pass's to judge),
    /// and MySQL's status after, as a preload does: an admin's change racing the write
    /// is written after it.
    pub(super) async fn mend_status(&self, event: &EventRecord) -> anyhow::Result<Option<String>> {
        if event.status == EventStatus::Draft
            || (event.status == EventStatus::Published && Utc::now() >= event.sale_end)
        {
            return Ok(None);
        }
        if !self.status_differs(event).await? {
            return Ok(None);
        }
        let now = match catalog::load(&self.mysql, event.id).await? {
            Some(now) if now.status == event.status => now,
            _ => return Ok(None), // changed meanwhile: the next pass looks again
        };
        self.preloader.set_sale_status(&now).await?;
        self.preloader.status_since(&now).await?;
        Ok(Some(format!(
            "Redis said another status than MySQL's {:?} (a close or reopen whose Redis write failed): written again",
            now.status
        )))
    }

    async fn status_differs(&self, event: &EventRecord) -> anyhow::Result<bool> {
        let mut redis = self.redis.clone();
        let mut metas = Vec::new();
        // One call per hash: on a cluster each bucket's is a slot of its own.
        for meta in self.keys.metas(EventId(event.id), event.buckets) {
            let status: Option<String> = redis::cmd("HGET")
                .arg(meta)
                .arg("status")
                .query_async(&mut redis)
                .await?;
            metas.push(status);
        }
        let listed: Option<String> = redis::cmd("HGET")
            .arg(self.keys.sales_index())
            .arg(event.id)
            .query_async(&mut redis)
            .await?;
        Ok(differs(&sales_entry(event), &metas, listed.as_deref()))
    }
}

#[cfg(test)]
mod tests {
    use super::differs;

    #[test]
    fn a_status_redis_holds_against_mysqls_is_a_difference() {
        let closed = "closed:1000:2000";
        let some = |s: &str| Some(s.to_owned());
        // Agreeing, or not loaded (no hash), or not listed: nothing to mend.
        assert!(!differs(
            closed,
            &[some("closed"), some("closed")],
            Some(closed)
        ));
        assert!(!differs(closed, &[None, None], None));
        // A close whose Redis write failed: the hashes and the index still say open.
        assert!(differs(closed, &[some("open")], Some("open:1000:2000")));
        // Half written: one bucket's hash, or only the index.
        assert!(differs(
            closed,
            &[some("closed"), some("open")],
            Some(closed)
        ));
        assert!(differs(closed, &[some("closed")], Some("open:1000:2000")));
        // A reopen whose Redis write failed.
        assert!(differs("open:1000:2000", &[some("closed")], None));
    }
}
