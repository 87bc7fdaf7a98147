//! JSON input as the API documents it.

use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// `T` from JSON text, read in one pass that
/// - refuses an object naming a key twice: serde_json keeps the last of them, where the
///   edge, reading a purchase's category from the text, takes the first — so
///   `{"category_id":2,"quantity":1,"category_id":1}` passed the edge's sold-out check for
///   category 2 and bought category 1 (review). Every input has one spelling;
/// - reads a whole number written as a float (`2.0`, `1e3`) as the integer it is: JSON
///   Schema, so OpenAPI 3.1, counts it as an integer; serde would not.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let Strict(value) = serde_json::from_slice(bytes)?;
    serde_json::from_value(value)
}

/// A `serde_json::Value` read with [`parse`]'s two rules.
struct Strict(Value);

impl<'de> de::Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Strict, E> {
        Ok(Strict(Value::Bool(b)))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Strict, E> {
        Ok(Strict(Value::from(n)))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Strict, E> {
        Ok(Strict(Value::from(n)))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Strict, E> {
        // 2^64 and -2^63 are exact as f64; integers beyond are left as they are.
        let whole = f.fract() == 0.0 && f.is_finite();
        Ok(Strict(
            if whole && (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                Value::from(f as u64)
            } else if whole && (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                Value::from(f as i64)
            } else {
                Value::from(f)
            },
        ))
    }

    fn visit_str<E>(self, s: &str) -> Result<Strict, E> {
        Ok(Strict(Value::String(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Strict, E> {
        Ok(Strict(Value::String(s)))
    }

    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }

    fn visit_none<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(Strict(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Strict(Value::Array(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut fields = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if fields.contains_key(&key) {
                return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
            }
            let Strict(value) = map.next_value()?;
            fields.insert(key, value);
        }
        Ok(Strict(Value::Object(fields)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Body {
        category_id: u64,
        quantity: Option<i64>,
        #[serde(default)]
        seat_ids: Vec<String>,
    }

    fn body(text: &str) -> Result<Body, String> {
        parse::<Body>(text.as_bytes()).map_err(|e| e.to_string())
    }

    #[test]
    fn a_key_named_twice_is_refused_at_any_depth_in_any_spelling() {
        for text in [
            r#"{"category_id":2,"quantity":1,"category_id":1}"#,
            r#"{"category_id":2,"quantity":1,"\u0063ategory_id":1}"#,
            r#"{"category_id":2,"quantity":1,"quantity":1}"#,
            r#"{"category_id":2,"seat_ids":[{"a":1,"a":2}]}"#,
        ] {
            let e = body(text).expect_err(text);
            assert!(e.contains("duplicate field"), "{text}: {e}");
        }
        let e = parse::<Value>(br#"{"a":{"b":1,"b":1}}"#).unwrap_err();
        assert!(e.to_string().contains("duplicate field `b`"), "{e}");
    }

    #[test]
    fn whole_numbers_written_as_floats_are_integers_and_others_are_not() {
        let b = body(r#"{"category_id":2.0,"quantity":1e1}"#).unwrap();
        assert_eq!((b.category_id, b.quantity), (2, Some(10)));
        assert_eq!(body(r#"{"category_id":20e-1}"#).unwrap().category_id, 2);
        assert_eq!(
            body(r#"{"category_id":2,"quantity":-3.0}"#)
                .unwrap()
                .quantity,
            Some(-3)
        );
        for text in [
            r#"{"category_id":2.5}"#,
            r#"{"category_id":1e30}"#,
            r#"{"category_id":-1}"#,
        ] {
            assert!(body(text).is_err(), "{text}");
        }
        let v: Value = parse(br#"{"x":[1.5,null,true,"s",{"y":18446744073709551615}]}"#).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"x":[1.5,null,true,"s",{"y":18446744073709551615u64}]})
        );
    }

    #[test]
    fn unknown_and_malformed_input_is_still_refused() {
        assert!(body(r#"{"category_id":2,"quantity":1"#).is_err());
        assert!(body(r#"{"category_id":"2"}"#).is_err());
        assert!(body("").is_err());
        assert!(body(r#"{"category_id":2} x"#).is_err());
    }
}
