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

/// An id in canonical decimal: digits only, no sign, no leading zero, within u64.
/// `+1`, `01`, `%31`, `1.0` and `18446744073709551616` are not ids.
pub fn canonical_id(segment: &str) -> Option<u64> {
    let b = segment.as_bytes();
    let canonical =
        !b.is_empty() && b.iter().all(u8::is_ascii_digit) && (b.len() == 1 || b[0] != b'0');
    if canonical {
        segment.parse().ok()
    } else {
        None
    }
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
    fn ids_are_canonical_decimal() {
        assert_eq!(canonical_id("0"), Some(0));
        assert_eq!(canonical_id("7"), Some(7));
        assert_eq!(canonical_id("18446744073709551615"), Some(u64::MAX));
        for other in [
            "",
            "+1",
            "-1",
            "01",
            "00",
            " 1",
            "1 ",
            "%31",
            "1.0",
            "1e3",
            "0x1",
            "١",
            "18446744073709551616",
            "99999999999999999999999",
        ] {
            assert_eq!(canonical_id(other), None, "{other:?}");
        }
    }

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
