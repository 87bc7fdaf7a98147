//! The ids an order's journey carries, as types: an event id cannot be passed where a
//! user id is expected. Each is a `u64` on the wire, in Redis and in MySQL.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<u64> for $name {
            fn from(id: u64) -> Self {
                $name(id)
            }
        }

        impl From<$name> for mysql_async::Value {
            fn from(id: $name) -> Self {
                mysql_async::Value::UInt(id.0)
            }
        }

        impl redis::ToRedisArgs for $name {
            fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
                self.0.write_redis_args(out)
            }
        }
    };
}

id_type!(
    /// An event (a concert, a voucher drop).
    EventId
);
id_type!(
    /// A ticket category of an event.
    CategoryId
);
id_type!(
    /// A buyer.
    UserId
);
id_type!(
    /// An order number, minted at admission (`crate::ids`); also the reservation's
    /// request id. Shown to clients as a decimal string (it does not fit a JSON double).
    OrderNo
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_and_bind_as_their_number() {
        assert_eq!(OrderNo(7).to_string(), "7");
        assert_eq!(
            mysql_async::Value::from(EventId(3)),
            mysql_async::Value::UInt(3)
        );
        assert_eq!(
            redis::ToRedisArgs::to_redis_args(&UserId(42)),
            vec![b"42".to_vec()]
        );
    }
}
