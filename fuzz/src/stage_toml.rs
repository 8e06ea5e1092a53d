//! Target 6: the operator's stage TOML and its resolution.
//!
//! Arbitrary text, and near-valid TOML built from the schema's sections and
//! keys with edge values (cpulists, huge and negative integers, NaN and
//! infinite floats, unknown keys, wrong types), is parsed with
//! `Config::from_toml` and resolved against an arbitrary topology and
//! command-line overrides, then matched with arbitrary guest stage names.
//! Checked: no panic; an error is one line naming something; an accepted
//! configuration keeps every rule of `host_sched::config` (stage cores
//! online, allowed and non-empty; housekeeping disjoint from them or equal
//! when shared; budgets unique, in range, and fitting the cores; policy
//! parameters in range).
//!
//! Known bug (found by this target, reported, not fixed here):
//! Found by this target, fixed: `Config::from_toml` panicked when toml's
//! error span did not fall on character boundaries (the one-character text
//! `é`), and a parse error whose span covers several lines
//! (`[[stage]]\nmin_cores = 1`) was not one line.

use host_sched::config::{resolve, Config, Overrides, Resolved, MAX_WEIGHT};
use host_sched::cpuset::CpuSet;
use host_sched::topology::Topology;

use crate::input::Input;

/// The target (see the module documentation).
pub fn fuzz(data: &[u8]) {
    let mut inp = Input::new(data);
    let topo = topology(&mut inp);
    let overrides = Overrides {
        cores: inp.bool().then(|| cpulist(&mut inp)),
        housekeeping: (inp.one_in(4)).then(|| cpulist(&mut inp)),
        policy: (inp.one_in(4)).then(|| inp.pick(&POLICIES).to_string()),
        visit: (inp.one_in(4)).then(|| inp.pick(&VISITS).to_string()),
    };
    let guest: Vec<String> = (0..inp.below(5))
        .map(|_| inp.pick(&NAMES).to_string())
        .collect();
    let text = if inp.one_in(4) {
        String::from_utf8_lossy(inp.rest()).into_owned()
    } else {
        near_valid_toml(&mut inp)
    };
    check(&text, &topo, &overrides, &guest);
}

const POLICIES: [&str; 7] = [
    "off",
    "pinned",
    "static",
    "proportional",
    "auto",
    "fast",
    "",
];
const VISITS: [&str; 4] = ["fifo", "cohort", "color", "lifo"];
const NAMES: [&str; 8] = ["parse", "plan", "execute", "commit", "", "a", "parse ", "é"];

fn set(mask: u16) -> CpuSet {
    let mut s = CpuSet::new();
    for cpu in 0..16 {
        if mask & (1 << cpu) != 0 {
            s.insert(cpu);
        }
    }
    s
}

/// A host: allowed CPUs non-empty and online (as `sched_getaffinity`
/// guarantees), more online CPUs, some isolated.
fn topology(inp: &mut Input) -> Topology {
    let allowed = set(inp.u16() | 1 << inp.below(16));
    let online = set(inp.u16()).union_with(&allowed);
    let isolated = set(inp.u16());
    Topology {
        allowed,
        online,
        isolated,
    }
}

trait Union {
    fn union_with(self, other: &CpuSet) -> CpuSet;
}
impl Union for CpuSet {
    fn union_with(mut self, other: &CpuSet) -> CpuSet {
        for cpu in other.iter() {
            self.insert(cpu);
        }
        self
    }
}

fn cpulist(inp: &mut Input) -> String {
    match inp.u8() % 10 {
        0 => String::new(),
        1 => " ".into(),
        2 => "0-1023".into(),
        3 => "1024".into(),
        4 => format!("{}-{}", inp.below(20), inp.below(20)),
        5 => "1,,2".into(),
        6 => format!("{}", inp.u64()),
        7 => String::from_utf8_lossy(&inp.bytes_below(6)).into_owned(),
        _ => {
            let parts: Vec<String> = (0..inp.range(1, 3))
                .map(|_| match inp.below(3) {
                    0 => format!("{}", inp.below(17)),
                    _ => format!("{}-{}", inp.below(9), inp.below(17)),
                })
                .collect();
            parts.join(",")
        }
    }
}

/// A TOML string literal of `s` (basic string with escapes).
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn int(inp: &mut Input) -> String {
    match inp.u8() % 8 {
        0 => "-1".into(),
        1 => i64::MAX.to_string(),
        2 => "0".into(),
        3 => u64::MAX.to_string(),
        4 => "60001".into(),
        _ => inp.below(70).to_string(),
    }
}

fn float(inp: &mut Input) -> String {
    match inp.u8() % 12 {
        0 => "nan".into(),
        1 => "inf".into(),
        2 => "-inf".into(),
        3 => "-0.0".into(),
        4 => "1e300".into(),
        5 => "1000000.0".into(),
        6 => "1000000.1".into(),
        7 => "0.0".into(),
        8 => "1".into(),
        _ => format!("{}.{}", inp.below(3), inp.below(100)),
    }
}

fn value(inp: &mut Input, key: &str) -> String {
    let wrong_type = inp.one_in(8);
    match key {
        "cores" | "housekeeping" if !wrong_type => quoted(&cpulist(inp)),
        "name" if !wrong_type => {
            if inp.bool() {
                quoted(inp.pick(&POLICIES))
            } else {
                let n = String::from_utf8_lossy(&inp.bytes_below(40)).into_owned();
                let known = inp.pick(&NAMES);
                quoted(inp.pick(&[known, n.as_str()]))
            }
        }
        "period_ms" | "min_cores" | "max_cores" if !wrong_type => int(inp),
        "smoothing" | "hysteresis" | "weight" if !wrong_type => float(inp),
        _ => inp
            .pick(&[
                "true",
                "[1, 2]",
                "{ a = 1 }",
                "\"x\"",
                "1",
                "1.5",
                "'''\nmulti\n'''",
                "1979-05-27",
            ])
            .into(),
    }
}

const SECTIONS: [&str; 7] = [
    "[host]",
    "[policy]",
    "[[stage]]",
    "[[stage]]",
    "[polcy]",
    "[stage]",
    "[[host]]",
];
const KEYS: [&str; 12] = [
    "cores",
    "housekeeping",
    "name",
    "period_ms",
    "smoothing",
    "hysteresis",
    "min_cores",
    "max_cores",
    "weight",
    "unknown",
    "name",
    "weight",
];

/// Lines of sections and `key = value` from the schema, with some noise.
fn near_valid_toml(inp: &mut Input) -> String {
    let mut text = String::new();
    let lines = inp.below(24);
    for _ in 0..lines {
        match inp.u8() % 16 {
            0..=2 => text.push_str(inp.pick(&SECTIONS)),
            3 => text.push_str(&String::from_utf8_lossy(&inp.bytes_below(12))),
            4 => text.push_str("# comment é"),
            _ => {
                let key = inp.pick(&KEYS);
                let v = value(inp, key);
                text.push_str(&format!("{key} = {v}"));
            }
        }
        text.push(if inp.one_in(32) { '\r' } else { '\n' });
    }
    text
}

fn check(text: &str, topo: &Topology, overrides: &Overrides, guest: &[String]) {
    let config = match Config::from_toml(text, "fuzz.toml") {
        Ok(c) => c,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.starts_with("fuzz.toml: "), "{msg}");
            // toml's own message: where, the line with a caret, what was
            // expected — bounded, whatever the input.
            assert!(
                msg.lines().count() <= 16 && msg.len() <= 4 * text.len() + 1024,
                "parse error out of bounds: {msg:?}"
            );
            return;
        }
    };
    let resolved = match resolve(&config, overrides, topo) {
        Ok(r) => r,
        Err(e) => {
            let msg = e.to_string();
            // Errors quote the offending value as it is; only values with
            // line breaks may break the line.
            let values = [
                config.host.cores.as_deref(),
                config.host.housekeeping.as_deref(),
                Some(config.policy.name.as_str()),
                overrides.cores.as_deref(),
                overrides.housekeeping.as_deref(),
                overrides.policy.as_deref(),
            ];
            let multiline_value = values.iter().flatten().any(|v| v.contains(['\n', '\r']))
                || config.stages.iter().any(|s| s.name.contains(['\n', '\r']));
            assert!(!msg.is_empty());
            assert!(multiline_value || !msg.contains('\n'), "{msg:?}");
            return;
        }
    };
    check_resolved(&resolved, topo);
    if let Ok(budgets) = resolved.budgets_for(guest) {
        assert_eq!(budgets.len(), guest.len());
        let n = resolved.stage_cores.len();
        assert!(budgets.iter().map(|b| b.max_cores).sum::<usize>() >= n);
        for (b, name) in budgets.iter().zip(guest) {
            assert_eq!(&b.name, name);
        }
        let ctx = resolved.context(guest.len() as u32, budgets);
        assert_eq!(ctx.cores.len(), n);
    }
}

fn check_resolved(r: &Resolved, topo: &Topology) {
    let n = r.stage_cores.len();
    assert!(n > 0, "no stage core");
    assert!(r.stage_cores.is_subset(&topo.online));
    assert!(r.stage_cores.is_subset(&topo.allowed));
    assert!(r.housekeeping.is_subset(&topo.online));
    if r.helpers_share_stage_cores {
        assert_eq!(r.housekeeping, r.stage_cores);
    } else {
        assert!(!r.housekeeping.is_empty());
        assert!(r.housekeeping.intersection(&r.stage_cores).is_empty());
    }
    let ms = r.period.as_millis();
    assert!((1..=60_000).contains(&ms), "period {ms} ms");
    assert!(r.smoothing > 0.0 && r.smoothing <= 1.0);
    assert!(r.hysteresis >= 0.0 && r.hysteresis.is_finite());
    let mut min_sum = 0usize;
    for (i, b) in r.budgets.iter().enumerate() {
        assert!((1..=32).contains(&b.name.len()));
        assert!(r.budgets[..i].iter().all(|o| o.name != b.name));
        assert!(
            b.min_cores <= b.max_cores && b.max_cores <= n,
            "{b:?} of {n}"
        );
        assert!((0.0..=MAX_WEIGHT).contains(&b.weight));
        min_sum += b.min_cores;
    }
    assert!(min_sum <= n);
}
