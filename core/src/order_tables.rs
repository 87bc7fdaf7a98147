//! The order tables (DESIGN.md "Keys, ids, tables"): `order_<n>` and `order_item_<n>`
//! for n in 0..`mysql.order_shards`, a buyer's orders in the shard of their gene
//! (`crate::ids`). The shard of an id, the tables' names, the order statuses and the
//! UNION over every shard are here, for the core, the bench's audit and the tests.

use std::fmt;

use crate::domain::OrderNo;
use crate::ids::gene;

/// An order's status in MySQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OrderStatus {
    /// Created, waiting for payment until its deadline.
    Unpaid,
    Paid,
    /// By its buyer, or at its deadline; its units went back.
    Cancelled,
    /// Paid, then refunded by the provider (set by hand today).
    RefundPending,
}

impl OrderStatus {
    pub const ALL: [OrderStatus; 4] = [
        OrderStatus::Unpaid,
        OrderStatus::Paid,
        OrderStatus::Cancelled,
        OrderStatus::RefundPending,
    ];

    /// For SQL: `status IN {LIVE_SQL}` selects the orders that hold their units.
    pub const LIVE_SQL: &str = "('UNPAID', 'PAID')";

    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Unpaid => "UNPAID",
            OrderStatus::Paid => "PAID",
            OrderStatus::Cancelled => "CANCELLED",
            OrderStatus::RefundPending => "REFUND_PENDING",
        }
    }

    pub fn parse(text: &str) -> anyhow::Result<OrderStatus> {
        OrderStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| anyhow::anyhow!("unknown order status {text:?}"))
    }

    /// Whether an order of this status holds its units (and seats).
    pub fn is_live(self) -> bool {
        matches!(self, OrderStatus::Unpaid | OrderStatus::Paid)
    }
}

impl fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<OrderStatus> for mysql_async::Value {
    fn from(s: OrderStatus) -> Self {
        mysql_async::Value::from(s.as_str())
    }
}

impl serde::Serialize for OrderStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The shard of an order number, or of a user id (both carry the gene).
pub fn shard_of(id: u64, shards: u32) -> u32 {
    (gene(id) % u64::from(shards)) as u32
}

/// The shard an order lives in.
pub fn shard_of_order(order_no: OrderNo, shards: u32) -> u32 {
    shard_of(order_no.0, shards)
}

/// `order_<n>`, quoted for SQL.
pub fn orders(shard: u32) -> String {
    format!("`order_{shard}`")
}

/// `order_item_<n>`, quoted for SQL.
pub fn items(shard: u32) -> String {
    format!("`order_item_{shard}`")
}

/// How many order shards the connected database has (its `order_<n>` tables).
pub async fn count_shards<Q: mysql_async::prelude::Queryable>(conn: &mut Q) -> anyhow::Result<u32> {
    let n: Option<u32> = conn
        .query_first(
            "SELECT COUNT(*) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name REGEXP '^order_[0-9]+$'",
        )
        .await?;
    Ok(n.unwrap_or(0))
}

/// One SELECT over every shard, as a UNION ALL: in `select`, `{orders}` and `{items}`
/// stand for the shard's two tables. Wrap it as a derived table to aggregate.
pub fn over_shards(shards: u32, select: &str) -> String {
    (0..shards)
        .map(|n| {
            select
                .replace("{orders}", &orders(n))
                .replace("{items}", &items(n))
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

/// The parameters of [`over_shards`]'s SELECT: one shard's `params`, once per shard.
pub fn per_shard(shards: u32, params: &[mysql_async::Value]) -> mysql_async::Params {
    mysql_async::Params::Positional((0..shards).flat_map(|_| params.iter().cloned()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_and_only_unpaid_and_paid_hold_units() {
        for s in OrderStatus::ALL {
            assert_eq!(OrderStatus::parse(s.as_str()).unwrap(), s);
            assert_eq!(
                s.is_live(),
                OrderStatus::LIVE_SQL.contains(&format!("'{s}'")),
                "{s}"
            );
        }
        assert!(OrderStatus::parse("unpaid").is_err());
    }

    #[test]
    fn an_order_and_its_buyer_share_a_shard() {
        let (user, order) = (1_000_003u64, OrderNo((12_345u64 << 6) | (1_000_003 & 63)));
        for shards in [1, 2, 4, 64] {
            assert_eq!(shard_of(user, shards), shard_of_order(order, shards));
        }
    }

    #[test]
    fn over_shards_names_each_shards_tables() {
        let sql = over_shards(2, "SELECT o.x FROM {orders} o JOIN {items} i");
        assert_eq!(
            sql,
            "SELECT o.x FROM `order_0` o JOIN `order_item_0` i UNION ALL \
             SELECT o.x FROM `order_1` o JOIN `order_item_1` i"
        );
    }
}
