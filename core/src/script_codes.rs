//! Each Redis script that answers with a code has one Rust enum mirroring its codes
//! ([`ScriptCode`]), listed in the script's header as `<code> <NAME>  what it means`,
//! NAME being the variant's name in SCREAMING_SNAKE_CASE. `from_code` maps an answer to
//! its variant; the tests hold every enum to its script: the header's codes, the
//! variants and the codes the script's body returns are the same set.

/// A script of `lua/redis/` as Redis runs it: the pieces of `lua/redis/lib/` (seat
/// choice, route segments) in front, so every script that chooses seats or counts
/// segments does it the same way.
#[macro_export]
macro_rules! with_lua_lib {
    ($script:literal) => {
        concat!(
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../lua/redis/lib/seat_pick.lua"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../lua/redis/lib/segments.lua"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../lua/redis/",
                $script
            ))
        )
    };
}

/// An enum mirroring a script's answers: its variants, each with its code.
pub trait ScriptCode: Copy + std::fmt::Debug + PartialEq + 'static {
    /// The script (for errors).
    const SCRIPT: &'static str;
    const ALL: &'static [Self];

    fn code(self) -> i64;

    /// The variant whose code is `code`.
    fn from_code(code: i64) -> anyhow::Result<Self> {
        Self::ALL
            .iter()
            .find(|c| c.code() == code)
            .copied()
            .ok_or_else(|| anyhow::anyhow!("{} returned unknown code {code}", Self::SCRIPT))
    }
}

/// `QueuedAgain` → `QUEUED_AGAIN`.
#[cfg(test)]
fn screaming(variant: &str) -> String {
    let mut name = String::new();
    for (i, ch) in variant.chars().enumerate() {
        if ch.is_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(ch.to_ascii_uppercase());
    }
    name
}

/// The `(code, NAME)` pairs of the script's "Returns" header.
#[cfg(test)]
fn documented(script: &str) -> Vec<(i64, String)> {
    script
        .lines()
        .take_while(|l| l.starts_with("--"))
        .skip_while(|l| !l.starts_with("-- Returns"))
        .filter_map(|l| {
            let mut words = l.trim_start_matches('-').split_whitespace();
            let code = words.next()?.parse().ok()?;
            let name = words.next()?;
            name.chars()
                .all(|c| c.is_ascii_uppercase() || c == '_')
                .then(|| (code, name.to_owned()))
        })
        .collect()
}

/// The literal codes the script's body returns: `return N` and `return {N, …}`.
#[cfg(test)]
fn returned(script: &str) -> std::collections::BTreeSet<i64> {
    script
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .flat_map(|l| l.split("return ").skip(1))
        .filter_map(|rest| {
            let rest = rest.trim_start_matches('{');
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '-'))
                .unwrap_or(rest.len());
            rest[..end].parse().ok()
        })
        .collect()
}

/// Asserts that `T` mirrors the script one to one (see the module's comment).
#[cfg(test)]
pub fn assert_mirrored<T: ScriptCode>(script: &str) {
    let header = documented(script);
    let mut expected: Vec<(i64, String)> = T::ALL
        .iter()
        .map(|c| (c.code(), screaming(&format!("{c:?}"))))
        .collect();
    let mut header_sorted = header.clone();
    header_sorted.sort();
    expected.sort();
    assert_eq!(header_sorted, expected, "the header's codes and the enum's");
    let codes: std::collections::BTreeSet<i64> = header.iter().map(|(c, _)| *c).collect();
    assert_eq!(returned(script), codes, "the codes the body returns");
    for c in T::ALL {
        assert_eq!(T::from_code(c.code()).unwrap(), *c);
    }
    let (low, high) = (codes.iter().min().unwrap(), codes.iter().max().unwrap());
    for outside in (low - 1..=high + 1).filter(|n| !codes.contains(n)) {
        assert!(T::from_code(outside).is_err(), "{outside} is no code");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every script's header names a Rust type that exists where it says.
    #[test]
    fn every_header_names_a_mirror_that_exists() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut scripts = 0;
        for entry in std::fs::read_dir(root.join("lua/redis")).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                continue; // lib/: pieces the core puts in front of scripts
            }
            let text = std::fs::read_to_string(&path).unwrap();
            scripts += 1;
            let header: String = text
                .lines()
                .take_while(|l| l.starts_with("--"))
                .map(|l| l.trim_start_matches('-').trim())
                .collect::<Vec<_>>()
                .join(" ");
            let Some((_, rest)) = header.split_once("(mirrored by ") else {
                panic!("{} does not say what mirrors its answer", path.display());
            };
            let mut words = rest.split_whitespace();
            let name = words.next().unwrap();
            assert_eq!(words.next(), Some("in"), "{}", path.display());
            let file = words.next().unwrap().trim_end_matches([')', ':']);
            let source = std::fs::read_to_string(root.join(file))
                .unwrap_or_else(|e| panic!("{}: {file}: {e}", path.display()));
            assert!(
                source.contains(&format!("pub enum {name} "))
                    || source.contains(&format!("pub struct {name}("))
                    || source.contains(&format!("pub struct {name} {{")),
                "{} names {name}, which {file} does not define",
                path.display()
            );
        }
        assert!(scripts >= 8);
    }

    #[test]
    fn the_parsers_read_what_the_headers_write() {
        let script = "-- Returns (mirrored by X in y):\n--    1 QUEUED   ok\n--   -2 NOT_OPEN  no\nif a then return {-2, ''} end\nreturn 1\n";
        assert_eq!(
            documented(script),
            vec![(1, "QUEUED".into()), (-2, "NOT_OPEN".into())]
        );
        assert_eq!(
            returned(script).into_iter().collect::<Vec<_>>(),
            vec![-2, 1]
        );
        assert_eq!(screaming("LimitReached"), "LIMIT_REACHED");
    }
}
