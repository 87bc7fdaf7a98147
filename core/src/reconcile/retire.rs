//! A finished sale is retired: once its sale has been over (its window ended, or an
//! admin closed it: `closed_ms` in its metadata) for `reconcile.retire_after_s`
//! and a pass found its books balanced with nothing queued, unpaid, moving or locked,
//! its Redis keys are closed to admissions and the event leaves the sales index.
//! Everything that walks the index every second or so (each core's order workers and
//! sweeper, each edge's refresh, each core's reconciler with its MySQL counts) then stops
//! reading it, so what an idle stack spends no longer grows with every sale it ever ran.
//! The keys stay: buyers' statuses, the stats and a manual reconcile keep working; an
//! admin's close or reopen lists the event again (the next pass decides again).
//!
//! An admin's reopen racing a retirement (its metadata written between this pass's
//! close and unlist, its index entry the same text as before) is caught after the
//! unlist: metadata found open, or closed at another time than before (reopened and
//! closed again, buyers perhaps between), lists the event again.

use std::sync::LazyLock;
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;

use super::{Reconciler, Report};
use crate::catalog::EventRecord;
use crate::domain::EventId;
use crate::keys::Bucket;
use crate::lock::Lock;
use crate::script_codes::ScriptCode;

static RETIRE_BUCKET: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/retire_bucket.lua"))
});
static UNLIST_SALE: LazyLock<redis::Script> = LazyLock::new(|| {
    crate::infra::redis::script(include_str!("../../../lua/redis/unlist_sale.lua"))
});

/// `retire_bucket.lua`'s answers, one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retired {
    Closed = 1,
    Busy = 0,
    NotOver = -1,
}

impl ScriptCode for Retired {
    const SCRIPT: &'static str = "retire_bucket.lua";
    const ALL: &'static [Retired] = &[Retired::Closed, Retired::Busy, Retired::NotOver];

    fn code(self) -> i64 {
        self as i64
    }
}

/// `unlist_sale.lua`'s answers, one to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unlisted {
    Gone = 1,
    Changed = 0,
    NotOver = -1,
}

impl ScriptCode for Unlisted {
    const SCRIPT: &'static str = "unlist_sale.lua";
    const ALL: &'static [Unlisted] = &[Unlisted::Gone, Unlisted::Changed, Unlisted::NotOver];

    fn code(self) -> i64 {
        self as i64
    }
}

/// Why a pass does not retire an event (yet), or None when it may.
pub fn not_yet(
    event: &EventRecord,
    report: &Report,
    now_ms: i64,
    after: Duration,
) -> Option<&'static str> {
    let b = &report.balance;
    let over_ms = event.sale_end.timestamp_millis() + after.as_millis() as i64;
    // A sale closed early: how long ago is in its metadata (retire_bucket.lua judges).
    if now_ms < over_ms && event.status != crate::catalog::EventStatus::Closed {
        Some("the sale is not over for long enough")
    } else if !report.actions.is_empty() {
        Some("this pass healed something")
    } else if !b.loaded || b.redis_unavailable.is_some() {
        Some("its keys are not all in Redis")
    } else if b.queued_reservations > 0 {
        Some("reservations are queued")
    } else if b.categories.iter().any(|c| c.unpaid > 0) {
        // A cancellation or expiry gives units back into Redis, and a restock that failed
        // is healed by a pass: the event stays listed while any order can still do so.
        Some("orders are still unpaid")
    } else if b.in_flight {
        Some("units are moving between buckets or locked for seats")
    } else if !b.settled() {
        Some("its books do not balance")
    } else {
        None
    }
}

impl Reconciler {
    /// Retires `event` if [`not_yet`] finds nothing against it, under the event's
    /// preload lock (no heal, move of a heal, or rebuild meanwhile): closes every bucket's
    /// keys (only while its stream is empty), then takes the event out of the sales
    /// index (only if its entry is the one this pass saw); each step only once the sale
    /// is over by that Redis node's clock. True when it left the index.
    pub async fn retire_if_over(
        &self,
        event: &EventRecord,
        report: &Report,
    ) -> anyhow::Result<bool> {
        if let Some(why) = not_yet(
            event,
            report,
            Utc::now().timestamp_millis(),
            self.retire_after,
        ) {
            tracing::trace!(event_id = event.id, why, "not retired");
            return Ok(false);
        }
        let mut redis = self.redis.clone();
        let Some(lock) = Lock::acquire(
            &mut redis,
            self.keys.preload_lock(event.id),
            self.preloader.lock_ttl,
            super::LOCK_WAIT,
        )
        .await
        .context("Failed to take the preload lock")?
        else {
            return Ok(false);
        };
        let retired = lock
            .renewed_while(
                &self.redis,
                self.preloader.lock_ttl,
                "a retirement",
                self.retire_locked(event),
            )
            .await;
        lock.release(&mut redis).await?;
        retired
    }

    async fn retire_locked(&self, event: &EventRecord) -> anyhow::Result<bool> {
        // The pass read the event before the lock: an admin's close or reopen since
        // (MySQL first, then Redis) is seen here, and the next pass decides.
        match crate::catalog::load(&self.mysql, event.id).await? {
            Some(now) if now.status == event.status => {}
            _ => return Ok(false),
        }
        let metas = self.keys.metas(EventId(event.id), event.buckets);
        let before = self.closed_states(&metas).await?;
        // The seats' slot first: no seat lock is taken from here on; then none may be
        // pending nor any unit moving, looked at again now that none can start.
        if event.buckets > 1
            && (!self.close(self.keys.event_meta(event.id), None).await?
                || !self.under_way(event).await?.is_empty())
        {
            return Ok(false);
        }
        for b in Bucket::all(event.id, event.buckets) {
            if !self
                .close(self.keys.meta(b), Some(self.keys.order_stream(b)))
                .await?
            {
                // A reservation came in after the measurement: the next pass sees it.
                return Ok(false);
            }
        }
        let code: i64 = UNLIST_SALE
            .key(self.keys.sales_index())
            .arg(event.id)
            .arg(crate::preload::sales_entry(event))
            .arg(self.retire_after.as_millis() as u64)
            .invoke_async(&mut self.redis.clone())
            .await
            .context("unlist_sale.lua failed")?;
        if Unlisted::from_code(code)? != Unlisted::Gone {
            return Ok(false);
        }
        // An admin's reopen (it takes no lock) may have written "open" into the metadata
        // after this pass closed it — or reopened and closed again, with buyers between —
        // its index entry reading as before: listed again, the next pass decides afresh,
        // rather than a sale left open, or with reservations, and unlisted.
        let after = self.closed_states(&metas).await?;
        let reopened = after
            .iter()
            .zip(&before)
            .any(|((status, since), (_, was))| status.as_deref() != Some("closed") || since != was);
        if reopened {
            redis::cmd("HSETNX")
                .arg(self.keys.sales_index())
                .arg(event.id)
                .arg(crate::preload::sales_entry(event))
                .query_async::<()>(&mut self.redis.clone())
                .await?;
            return Ok(false);
        }
        if !self.purge_after.is_zero() {
            redis::cmd("HSET")
                .arg(self.keys.retired_sales())
                .arg(event.id)
                .arg(Utc::now().timestamp_millis())
                .query_async::<()>(&mut self.redis.clone())
                .await
                .context("Failed to note the retirement for the purge")?;
        }
        self.forget_gauges(event);
        tracing::info!(
            event_id = event.id,
            sale_end = %event.sale_end,
            "sale retired: over, its books balance and nothing is queued; it left the sales index (its keys stay)"
        );
        Ok(true)
    }

    /// Each hash's status and close time (`closed_ms`), in order.
    async fn closed_states(
        &self,
        metas: &[String],
    ) -> anyhow::Result<Vec<(Option<String>, Option<String>)>> {
        let mut states = Vec::with_capacity(metas.len());
        for meta in metas {
            let (status, since): (Option<String>, Option<String>) = redis::cmd("HMGET")
                .arg(meta)
                .arg("status")
                .arg("closed_ms")
                .query_async(&mut self.redis.clone())
                .await?;
            states.push((status, since));
        }
        Ok(states)
    }

    /// `retire_bucket.lua` on one meta key (and its stream). True when closed.
    async fn close(&self, meta: String, stream: Option<String>) -> anyhow::Result<bool> {
        let stream = stream.unwrap_or_else(|| meta.clone());
        let code: i64 = RETIRE_BUCKET
            .key(meta)
            .key(stream)
            .arg(self.retire_after.as_millis() as u64)
            .invoke_async(&mut self.redis.clone())
            .await
            .context("retire_bucket.lua failed")?;
        Ok(Retired::from_code(code)? == Retired::Closed)
    }

    /// Deletes the buyers' records of every sale retired `reconcile.purge_after_s` ago
    /// or more ([`Keys::purged_when_retired`]), under each event's preload lock; a sale
    /// listed again since (reopened, or rebuilt by a reconcile) is only taken off the
    /// list of retired sales: it is retired again, and purged later, in its turn.
    pub async fn purge_due(&self) -> anyhow::Result<()> {
        if self.purge_after.is_zero() {
            return Ok(());
        }
        let mut redis = self.redis.clone();
        let retired: Vec<(u64, i64)> = redis::cmd("HGETALL")
            .arg(self.keys.retired_sales())
            .query_async(&mut redis)
            .await
            .context("Failed to read the retired sales")?;
        let due_ms = Utc::now().timestamp_millis() - self.purge_after.as_millis() as i64;
        let per_event = self.preloader.call_timeout.for_pass();
        for (id, at) in retired.into_iter().filter(|&(_, at)| at <= due_ms) {
            if let Err(e) = per_event.try_within("a purge", self.purge(id, at)).await {
                tracing::warn!(
                    event_id = id,
                    error = format!("{e:#}"),
                    "purge of a retired sale failed; will retry"
                );
            }
        }
        Ok(())
    }

    async fn purge(&self, id: u64, retired_ms: i64) -> anyhow::Result<()> {
        let mut redis = self.redis.clone();
        let Some(event) = crate::catalog::load(&self.mysql, id).await? else {
            return self.unnote_retired(id).await;
        };
        let Some(lock) = Lock::acquire(
            &mut redis,
            self.keys.preload_lock(id),
            self.preloader.lock_ttl,
            super::LOCK_WAIT,
        )
        .await
        .context("Failed to take the preload lock")?
        else {
            return Ok(());
        };
        let purge = async {
            // Under the lock, as a retirement notes it: the note read may be a retirement
            // before a reopen; the one now is the one to act on, later.
            let noted: Option<i64> = redis::cmd("HGET")
                .arg(self.keys.retired_sales())
                .arg(id)
                .query_async(&mut redis.clone())
                .await?;
            if noted != Some(retired_ms) {
                return Ok(());
            }
            let listed: bool = redis::cmd("HEXISTS")
                .arg(self.keys.sales_index())
                .arg(id)
                .query_async(&mut redis.clone())
                .await?;
            if !listed {
                // One call per hash tag: on a cluster the buckets are in other slots.
                for keys in self.keys.purged_when_retired(EventId(id), event.buckets) {
                    redis::cmd("UNLINK")
                        .arg(keys)
                        .query_async::<()>(&mut redis.clone())
                        .await?;
                }
                tracing::info!(
                    event_id = id,
                    retired_ms,
                    "retired sale purged: its buyers' records, stream and metadata deleted from Redis (statuses are read from the orders now)"
                );
            }
            self.unnote_retired(id).await
        };
        let purged = lock
            .renewed_while(&self.redis, self.preloader.lock_ttl, "a purge", purge)
            .await;
        lock.release(&mut redis).await?;
        purged
    }

    /// Takes the event off the list of retired sales waiting for their purge.
    async fn unnote_retired(&self, id: u64) -> anyhow::Result<()> {
        redis::cmd("HDEL")
            .arg(self.keys.retired_sales())
            .arg(id)
            .query_async::<()>(&mut self.redis.clone())
            .await
            .context("Failed to update the retired sales")
    }

    /// A retired event's gauges are no longer kept up to date: they go, rather than
    /// show its last pass's figures for ever (so do a sale's not yet open, mod.rs).
    pub(super) fn forget_gauges(&self, event: &EventRecord) {
        let id = event.id.to_string();
        for c in &event.categories {
            let labels = [id.as_str(), &c.id.to_string()];
            for gauge in [&self.gap_gauge, &self.remain_gauge, &self.oversold_gauge] {
                let _ = gauge.remove_label_values(&labels);
            }
        }
        let mut alarmed = self.alarmed.lock().expect("not poisoned");
        alarmed.retain(|(e, _)| *e != event.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::{Balance, CategoryBalance};

    /// A pass's report on validate.rs's test event (its sale over at 12:00), every
    /// category balanced, nothing queued, healed, unpaid or under way.
    fn quiet() -> (EventRecord, Report) {
        let event = crate::admission::validate::tests::event();
        let categories = event
            .categories
            .iter()
            .map(|c| CategoryBalance {
                category_id: c.id,
                name: c.name.clone(),
                total: i64::from(c.total),
                redis_available: Some(i64::from(c.total) - 2),
                queued: Some(0),
                unpaid: 0,
                paid: 2,
                gap: Some(0),
                db_remain: i64::from(c.total) - 2,
                unsynced: 0,
                remain_gap: 0,
                oversold: 0,
                segments: None,
            })
            .collect();
        let report = Report {
            event_id: event.id,
            actions: Vec::new(),
            balance: Balance {
                event_id: event.id,
                loaded: true,
                queued_reservations: 0,
                categories,
                redis_unavailable: None,
                in_flight: false,
            },
        };
        (event, report)
    }

    #[test]
    fn a_sale_is_retired_only_when_over_for_long_enough_and_nothing_is_left_to_do() {
        let after = Duration::from_secs(60);
        let (event, report) = quiet();
        let end = event.sale_end.timestamp_millis();
        assert_eq!(not_yet(&event, &report, end + 60_000, after), None);
        assert!(not_yet(&event, &report, end + 59_999, after).is_some());
        let over = end + 3_600_000;
        let refused = |change: &dyn Fn(&mut Report)| {
            let (event, mut report) = quiet();
            change(&mut report);
            not_yet(&event, &report, over, after)
        };
        assert!(refused(&|r| r.actions.push("healed".into())).is_some());
        assert!(refused(&|r| r.balance.loaded = false).is_some());
        assert!(refused(&|r| r.balance.redis_unavailable = Some("down".into())).is_some());
        assert!(refused(&|r| r.balance.queued_reservations = 1).is_some());
        assert!(refused(&|r| r.balance.in_flight = true).is_some());
        assert!(refused(&|r| r.balance.categories[1].unpaid = 1).is_some());
        assert!(refused(&|r| r.balance.categories[0].gap = Some(1)).is_some());
        assert!(refused(&|r| r.balance.categories[0].remain_gap = -1).is_some());
        assert_eq!(refused(&|_| {}), None);
        // Closed early: the time is its metadata's to say (retire_bucket.lua).
        let (mut closed, report) = quiet();
        closed.status = crate::catalog::EventStatus::Closed;
        assert_eq!(not_yet(&closed, &report, end - 3_600_000, after), None);
    }

    #[test]
    fn every_code_of_the_scripts_maps_to_one_variant() {
        crate::script_codes::assert_mirrored::<super::Retired>(include_str!(
            "../../../lua/redis/retire_bucket.lua"
        ));
        crate::script_codes::assert_mirrored::<super::Unlisted>(include_str!(
            "../../../lua/redis/unlist_sale.lua"
        ));
    }
}
