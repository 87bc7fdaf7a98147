//! What the stores did over a measurement, per order: MariaDB's statements, round trips,
//! commits and log flushes (`SHOW GLOBAL STATUS`), and Redis's calls per command
//! (`INFO commandstats`, every node added up). The CPU breakdown (`cpu`) says which part
//! spends the time; these say on what.

use std::collections::BTreeMap;

use mysql_async::prelude::Queryable;
use serde::Serialize;

use crate::stack::Stack;

/// MariaDB's counters that matter per order (server-wide, so other clients count too).
const MYSQL: [&str; 19] = [
    "Questions",
    "Handler_write",
    "Handler_update",
    "Handler_read_key",
    "Handler_read_next",
    "Handler_read_rnd_next",
    "Innodb_rows_read",
    "Com_select",
    "Com_insert",
    "Com_update",
    "Com_insert_select",
    "Com_delete",
    "Com_commit",
    "Com_begin",
    "Com_stmt_execute",
    "Com_set_option",
    "Innodb_log_writes",
    "Innodb_data_fsyncs",
    "Innodb_os_log_written",
];

#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    mysql: BTreeMap<String, u64>,
    redis: BTreeMap<String, u64>,
}

pub async fn snapshot(stack: &Stack) -> anyhow::Result<Snapshot> {
    let mut conn = stack.mysql.get_conn().await?;
    let rows: Vec<(String, String)> = conn.query("SHOW GLOBAL STATUS").await?;
    let mysql = rows
        .into_iter()
        .filter(|(name, _)| MYSQL.iter().any(|m| m.eq_ignore_ascii_case(name)))
        .filter_map(|(name, v)| Some((name, v.parse().ok()?)))
        .collect();
    let mut redis = BTreeMap::new();
    for node in &stack.redis_nodes {
        let mut r = stack.redis_node(node).await?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut r)
            .await?;
        for (command, calls) in commandstats(&info) {
            *redis.entry(command).or_default() += calls;
        }
    }
    Ok(Snapshot { mysql, redis })
}

/// `cmdstat_<name>:calls=<n>,...` lines → name → calls.
fn commandstats(info: &str) -> Vec<(String, u64)> {
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// The counters' growth between two snapshots, per order.
#[derive(Debug, Clone, Serialize)]
pub struct PerOrder {
    pub orders: u64,
    pub mysql: BTreeMap<String, f64>,
    /// Redis calls per order by command, the largest ones (at least 0.01 per order).
    pub redis: BTreeMap<String, f64>,
    pub redis_calls: f64,
}

pub fn per_order(before: &Snapshot, after: &Snapshot, orders: u64) -> PerOrder {
    let n = orders.max(1) as f64;
    let grew = |a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
        b.iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.saturating_sub(a.get(k).copied().unwrap_or(0)) as f64 / n,
                )
            })
            .collect::<BTreeMap<_, _>>()
    };
    let redis = grew(&before.redis, &after.redis);
    PerOrder {
        orders,
        mysql: grew(&before.mysql, &after.mysql),
        redis_calls: redis.values().sum(),
        redis: redis.into_iter().filter(|(_, v)| *v >= 0.01).collect(),
    }
}

impl PerOrder {
    /// "MariaDB 3.1 statements (…), Redis 4.2 calls (evalsha 1.0, …)".
    pub fn line(&self) -> String {
        let m = |k: &str| self.mysql.get(k).copied().unwrap_or(0.0);
        let mut redis: Vec<_> = self.redis.iter().collect();
        redis.sort_by(|a, b| b.1.total_cmp(a.1));
        format!(
            "MariaDB {:.2} statements per order (select {:.2}, insert {:.2}, update {:.2}, commit {:.3}, \
             prepared executions {:.2}), rows written {:.2}, updated {:.2}, read {:.1} (of which by full scan {:.1}), \
             {:.0} bytes of redo log, {:.3} fsyncs; Redis {:.2} calls per order ({})",
            m("Questions"),
            m("Com_select"),
            m("Com_insert"),
            m("Com_update"),
            m("Com_commit"),
            m("Com_stmt_execute"),
            m("Handler_write"),
            m("Handler_update"),
            m("Innodb_rows_read"),
            m("Handler_read_rnd_next"),
            m("Innodb_os_log_written"),
            m("Innodb_data_fsyncs"),
            self.redis_calls,
            redis
                .iter()
                .take(8)
                .map(|(k, v)| format!("{k} {v:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_lines_give_calls_per_command() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=40,usec_per_call=3.33\r\n\
                    cmdstat_xadd:calls=7,usec=1\r\ngarbage\r\n";
        assert_eq!(
            commandstats(info),
            vec![("evalsha".into(), 12), ("xadd".into(), 7)]
        );
    }

    #[test]
    fn growth_is_per_order() {
        let before = Snapshot {
            mysql: BTreeMap::from([("Questions".into(), 100)]),
            redis: BTreeMap::from([("evalsha".into(), 10)]),
        };
        let after = Snapshot {
            mysql: BTreeMap::from([("Questions".into(), 400)]),
            redis: BTreeMap::from([("evalsha".into(), 110), ("xack".into(), 1)]),
        };
        let p = per_order(&before, &after, 100);
        assert_eq!(p.mysql["Questions"], 3.0);
        assert_eq!(p.redis["evalsha"], 1.0);
        assert_eq!(p.redis["xack"], 0.01);
        assert!((p.redis_calls - 1.01).abs() < 1e-9);
        assert!(p.line().contains("MariaDB 3.00 statements"));
    }
}
