//! JSON input as the API documents it.

use serde::de::DeserializeOwned;

/// `T` from JSON text, a whole number written as a float (`2.0`, `1e3`) read as the
/// integer it is: JSON Schema, so OpenAPI 3.1, counts it as an integer; serde would not.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let mut value: serde_json::Value = serde_json::from_slice(bytes)?;
    whole_numbers(&mut value);
    serde_json::from_value(value)
}

fn whole_numbers(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            // 2^64 and -2^63 are exact as f64; integers beyond are left as they are.
            let whole = if f.fract() != 0.0 || !f.is_finite() {
                None
            } else if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                Some(Value::from(f as u64))
            } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                Some(Value::from(f as i64))
            } else {
                None
            };
            if let Some(whole) = whole {
                *v = whole;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers),
        Value::Object(fields) => fields.values_mut().for_each(whole_numbers),
        _ => {}
    }
}
