//! What a sale cost each Redis node (EVALSHA calls and CPU seconds, from INFO), so the
//! spread of admissions over a cluster's masters is measured, not assumed.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::stack::Stack;

/// One node's share of a sale.
#[derive(Debug, Clone, Serialize)]
pub struct NodeUse {
    pub node: String,
    /// `master` or `slave`, at the end of the sale.
    pub role: String,
    /// Scripts run by hash (every admission is one).
    pub evalsha_calls: u64,
    /// used_cpu_user + used_cpu_sys.
    pub cpu_s: f64,
}

/// Every node's counters at one moment.
pub struct Snapshot(Vec<NodeUse>);

pub async fn snapshot(stack: &Stack) -> anyhow::Result<Snapshot> {
    let mut nodes = Vec::new();
    for url in &stack.redis_nodes {
        let mut redis = stack.redis_node(url).await?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .arg("cpu")
            .arg("replication")
            .query_async(&mut redis)
            .await?;
        nodes.push(parse(url, &info));
    }
    Ok(Snapshot(nodes))
}

fn parse(url: &str, info: &str) -> NodeUse {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    let evalsha_calls = field("cmdstat_evalsha")
        .split(',')
        .find_map(|kv| kv.strip_prefix("calls=")?.parse().ok())
        .unwrap_or(0);
    let cpu = |name: &str| field(name).parse::<f64>().unwrap_or(0.0);
    NodeUse {
        node: url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned(),
        role: field("role"),
        evalsha_calls,
        cpu_s: cpu("used_cpu_user") + cpu("used_cpu_sys"),
    }
}

/// Scripts a second, every master added up, below which the stack counts as quiet. An
/// idle stack runs its lock renewals and, per core, a look for idle reservations in
/// each listed stream every 2.5 s (29 a second on the cluster stack with 12 sales of 3
/// buckets listed); an earlier sale's orders coming due are cancelled at a few hundred
/// a second.
pub const QUIET_SCRIPTS_PER_S: f64 = 50.0;

/// Waits, at most `most_s` seconds (0: not at all), until the masters run fewer than
/// [`QUIET_SCRIPTS_PER_S`] scripts a second over one second; says on stderr what it
/// waited for. Called before a sale's event is created and its counters read (`sale`'s
/// `--quiet-s`).
pub async fn wait_quiet(stack: &Stack, most_s: u64) -> anyhow::Result<()> {
    if most_s == 0 {
        return Ok(());
    }
    let most = Duration::from_secs(most_s);
    let deadline = Instant::now() + most;
    let mut said = false;
    loop {
        let before = snapshot(stack).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rate = scripts(&between(&before, &snapshot(stack).await?)) as f64;
        if rate < QUIET_SCRIPTS_PER_S {
            if said {
                eprintln!("Redis is quiet ({rate:.0} scripts/s)");
            }
            return Ok(());
        }
        if Instant::now() >= deadline {
            eprintln!(
                "warning: Redis still runs {rate:.0} scripts/s after {} s; the per-node counters include that work",
                most.as_secs()
            );
            return Ok(());
        }
        if !said {
            eprintln!(
                "waiting for Redis to go quiet: the masters run {rate:.0} scripts/s (an earlier sale's overdue orders being cancelled?); at most {} s",
                most.as_secs()
            );
            said = true;
        }
    }
}

/// Scripts the masters ran, added up.
fn scripts(uses: &[NodeUse]) -> u64 {
    uses.iter()
        .filter(|u| u.role == "master")
        .map(|u| u.evalsha_calls)
        .sum()
}

/// Each node's use between two snapshots (nodes in both, in order).
pub fn between(before: &Snapshot, after: &Snapshot) -> Vec<NodeUse> {
    after
        .0
        .iter()
        .map(|a| {
            let b = before.0.iter().find(|b| b.node == a.node);
            NodeUse {
                node: a.node.clone(),
                role: a.role.clone(),
                evalsha_calls: a
                    .evalsha_calls
                    .saturating_sub(b.map_or(0, |b| b.evalsha_calls)),
                cpu_s: (a.cpu_s - b.map_or(0.0, |b| b.cpu_s)).max(0.0),
            }
        })
        .collect()
}

/// How evenly the masters ran the scripts: (most − fewest) ÷ mean over the masters,
/// 0 when even; None with fewer than two masters.
pub fn spread(uses: &[NodeUse]) -> Option<f64> {
    let calls: Vec<u64> = uses
        .iter()
        .filter(|u| u.role == "master")
        .map(|u| u.evalsha_calls)
        .collect();
    if calls.len() < 2 {
        return None;
    }
    let mean = calls.iter().sum::<u64>() as f64 / calls.len() as f64;
    let (max, min) = (calls.iter().max()?, calls.iter().min()?);
    (mean > 0.0).then(|| (max - min) as f64 / mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_gives_calls_cpu_and_role() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=120,usec=900,usec_per_call=7.5\r\n\
                    cmdstat_get:calls=3\r\n# CPU\r\nused_cpu_sys:1.25\r\nused_cpu_user:2.5\r\n\
                    used_cpu_sys_children:9\r\n# Replication\r\nrole:master\r\n";
        let u = parse("redis://127.0.0.1:7001/", info);
        assert_eq!(u.node, "127.0.0.1:7001");
        assert_eq!(
            (u.evalsha_calls, u.cpu_s, u.role.as_str()),
            (120, 3.75, "master")
        );
    }

    #[test]
    fn spread_is_over_masters_only() {
        let node = |role: &str, calls| NodeUse {
            node: String::new(),
            role: role.into(),
            evalsha_calls: calls,
            cpu_s: 0.0,
        };
        let even = [node("master", 100), node("master", 110), node("slave", 0)];
        assert!((spread(&even).unwrap() - 10.0 / 105.0).abs() < 1e-9);
        assert_eq!(spread(&[node("master", 5)]), None);
        assert_eq!(spread(&[node("master", 300), node("master", 0)]), Some(2.0));
    }
}
