//! `stampede reconcile`: one pass over the events, printed as a table of their books.

use super::Reconciler;
use crate::config::Resolved;

/// One reconciliation pass (healing unless `dry_run`) over `events`, or every event with
/// a sale; prints each category's books and the actions taken. True when every gap is
/// 0 afterwards.
pub async fn run_once(config: &Resolved, events: Vec<u64>, dry_run: bool) -> anyhow::Result<bool> {
    let reconciler = Reconciler::connect(config).await?;
    let events = if events.is_empty() {
        reconciler.events(config.settings.preload.window_s).await?
    } else {
        events
    };
    let mut balanced = true;
    println!(
        "{:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>5} {:>8} {:>8} {:>6}",
        "event",
        "category",
        "total",
        "redis",
        "queued",
        "unpaid",
        "paid",
        "gap",
        "remain",
        "unsynced",
        "r_gap"
    );
    for id in events {
        // Bounded as a background pass is: a MySQL call that hangs would otherwise keep
        // the event's preload lock renewed for as long as this command runs.
        let pass = reconciler.reconcile(id, !dry_run);
        let bound = reconciler.preloader.call_timeout.for_pass();
        let Some(report) = bound.try_within("a reconcile", pass).await? else {
            eprintln!("stampede: no event {id}");
            balanced = false;
            continue;
        };
        for c in &report.balance.categories {
            println!(
                "{:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>5} {:>8} {:>8} {:>6}",
                id,
                c.category_id,
                c.total,
                opt(c.redis_available),
                opt(c.queued),
                c.unpaid,
                c.paid,
                opt(c.gap),
                c.db_remain,
                c.unsynced,
                c.remain_gap
            );
        }
        for action in &report.actions {
            println!("event {id}: {action}");
        }
        balanced &= report.balance.settled();
    }
    Ok(balanced)
}

fn opt(n: Option<i64>) -> String {
    n.map_or("-".to_owned(), |n| n.to_string())
}
