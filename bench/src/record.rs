//! The recorder of a load run: answers by kind, their latencies, and a timeline.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::load::Answer;

/// Width of a timeline bucket.
pub const BUCKET: Duration = Duration::from_millis(100);

/// The `code` of an error body `{"error":{"code":"…"`, without parsing all of it.
pub fn error_code(body: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find("\"code\":\"")? + 8;
    let len = text[start..].find('"')?;
    Some(&text[start..start + len])
}

/// One kind of answer: its status and error code, how many, how fast.
struct Kind {
    status: u16,
    code: Box<str>,
    count: u64,
    latency: Histogram<u64>,
}

impl Kind {
    fn name(&self) -> String {
        if self.code.is_empty() {
            self.status.to_string()
        } else {
            format!("{} {}", self.status, self.code)
        }
    }
}

/// Answers by kind, their latencies, and admissions and rejects over time. Recording an
/// answer allocates nothing once its kind has been seen: the client's cost per request
/// is part of every ratio measured on the same cores.
pub struct Recorder {
    pub started: Instant,
    kinds: Vec<Kind>,
    /// Per bucket since `started`: (admitted, rejected).
    timeline: Vec<(u64, u64)>,
    pub errors: u64,
    pub last_answer: Option<Instant>,
}

impl Recorder {
    pub fn new(started: Instant) -> Recorder {
        Recorder {
            started,
            kinds: Vec::new(),
            timeline: Vec::new(),
            errors: 0,
            last_answer: None,
        }
    }

    fn kind(&mut self, status: u16, code: &str) -> &mut Kind {
        let i = match self
            .kinds
            .iter()
            .position(|k| k.status == status && &*k.code == code)
        {
            Some(i) => i,
            None => {
                self.kinds.push(Kind {
                    status,
                    code: code.into(),
                    count: 0,
                    latency: Histogram::new(3).expect("3 significant digits"),
                });
                self.kinds.len() - 1
            }
        };
        &mut self.kinds[i]
    }

    pub fn record(&mut self, a: &Answer) {
        let code = error_code(&a.body).unwrap_or("");
        let kind = self.kind(a.status, code);
        kind.count += 1;
        let _ = kind.latency.record(a.latency.as_micros().max(1) as u64);
        let now = Instant::now();
        let bucket = ((now - self.started).as_millis() / BUCKET.as_millis()) as usize;
        if self.timeline.len() <= bucket {
            self.timeline.resize(bucket + 1, (0, 0));
        }
        if a.status == 202 {
            self.timeline[bucket].0 += 1;
        } else if a.status >= 400 {
            self.timeline[bucket].1 += 1;
        }
        self.last_answer = Some(now);
    }

    pub fn merge(&mut self, other: Recorder) {
        for k in other.kinds {
            let mine = self.kind(k.status, &k.code);
            mine.count += k.count;
            let _ = mine.latency.add(&k.latency);
        }
        if self.timeline.len() < other.timeline.len() {
            self.timeline.resize(other.timeline.len(), (0, 0));
        }
        for (b, (a, r)) in other.timeline.into_iter().enumerate() {
            self.timeline[b].0 += a;
            self.timeline[b].1 += r;
        }
        self.errors += other.errors;
        self.last_answer = self.last_answer.max(other.last_answer);
    }

    /// Answers by kind: "202", "409 SOLD_OUT", …
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.kinds.iter().map(|k| (k.name(), k.count)).collect()
    }

    pub fn total(&self) -> u64 {
        self.kinds.iter().map(|k| k.count).sum()
    }

    /// Answers whose kind starts with `prefix` ("202", "409", "409 SOLD_OUT").
    pub fn count(&self, prefix: &str) -> u64 {
        self.kinds
            .iter()
            .filter(|k| k.name().starts_with(prefix))
            .map(|k| k.count)
            .sum()
    }

    /// (seconds since the start, admitted, rejected) per bucket.
    pub fn timeline(&self) -> Vec<(f64, u64, u64)> {
        self.timeline
            .iter()
            .enumerate()
            .map(|(b, (a, r))| (b as f64 * BUCKET.as_secs_f64(), *a, *r))
            .collect()
    }

    /// Latency percentiles per kind, in milliseconds.
    pub fn latencies(&self) -> BTreeMap<String, Latency> {
        self.kinds
            .iter()
            .map(|k| {
                let h = &k.latency;
                let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                (
                    k.name(),
                    Latency {
                        count: h.len(),
                        p50_ms: ms(0.50),
                        p95_ms: ms(0.95),
                        p99_ms: ms(0.99),
                        max_ms: h.max() as f64 / 1000.0,
                    },
                )
            })
            .collect()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_are_read_from_the_error_shape() {
        assert_eq!(
            error_code(br#"{"error":{"code":"SOLD_OUT","message":"x"}}"#),
            Some("SOLD_OUT")
        );
        assert_eq!(error_code(br#"{"status":"QUEUED"}"#), None);
    }
}
