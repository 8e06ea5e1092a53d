//! Tests of the configuration: parsing, resolution, errors naming key and value.

use super::*;

fn topo() -> Topology {
    Topology {
        allowed: CpuSet::parse("0-3").unwrap(),
        online: CpuSet::parse("0-3").unwrap(),
        isolated: CpuSet::new(),
    }
}

fn resolve_text(text: &str) -> Result<Resolved, StagesConfigError> {
    resolve(
        &Config::from_toml(text, "test.toml")?,
        &Overrides::default(),
        &topo(),
    )
}

#[test]
fn defaults_use_allowed_cores_and_no_housekeeping() {
    let r = resolve_text("").unwrap();
    assert_eq!(r.stage_cores.to_string(), "0-3");
    assert!(r.helpers_share_stage_cores);
    assert_eq!(r.policy, PolicyKind::Static);
    assert_eq!(r.period, Duration::from_millis(20));
}

#[test]
fn housekeeping_is_the_rest() {
    let r = resolve_text("[host]\ncores = \"1-3\"").unwrap();
    assert_eq!(r.housekeeping.to_string(), "0");
    assert!(!r.helpers_share_stage_cores);
}

#[test]
fn errors_name_key_and_value() {
    let cases = [
        (
            "[host]\ncores = \"0-7\"",
            "host.cores = '0-7': CPU 4 is not online",
        ),
        ("[host]\ncores = \"x\"", "host.cores = 'x'"),
        (
            "[host]\ncores = \"0-1\"\nhousekeeping = \"1-2\"",
            "host.housekeeping = '1-2': overlaps",
        ),
        (
            "[policy]\nname = \"fast\"",
            "policy.name = 'fast': unknown policy",
        ),
        ("[policy]\nperiod_ms = 0", "policy.period_ms = 0"),
        (
            "[policy]\nmax_p99_increase = -0.1",
            "policy.max_p99_increase = -0.1: must be a fraction in 0..=100",
        ),
        (
            "[policy]\nmax_p99_increase = nan",
            "policy.max_p99_increase = NaN",
        ),
        (
            "[policy]\nlatency_slo_us = 1e12",
            "policy.latency_slo_us = 1000000000000: must be µs in 0..=1000000000",
        ),
        (
            "[[stage]]\nname = \"a\"\nmin_cores = 3\nmax_cores = 1",
            "min_cores = 3 > max_cores = 1",
        ),
        (
            "[[stage]]\nname = \"a\"\nmin_cores = 3\n[[stage]]\nname = \"b\"\nmin_cores = 2",
            "budgets cannot fit: min_cores sum to 5",
        ),
        (
            "[[stage]]\nname = \"a\"\n[[stage]]\nname = \"a\"",
            "'a': defined twice",
        ),
        ("[[stage]]\nname = \"a\"\nweight = -1.0", "weight = -1"),
        (
            "[[stage]]\nname = \"a\"\nweight = 2e296",
            "weight = 2e296: must be in 0..=1000000",
        ),
        (
            "[[stage]]\nname = \"a\"\nmin_cores = 9223372036854775807",
            "min_cores",
        ),
        ("[polcy]\nname = \"static\"", "unknown field `polcy`"),
        // Found by fuzzing: a span inside a multi-byte character, and a
        // span over two lines.
        ("é", "test.toml: "),
        ("[host]\ncores = 1é", "test.toml: "),
        ("[[stage]]\nmin_cores = 1", "missing field `name`"),
    ];
    for (text, needle) in cases {
        let e = resolve_text(text).unwrap_err();
        let is_toml = matches!(e, StagesConfigError::Toml { .. });
        let e = e.to_string();
        assert!(e.contains(needle), "{text:?}: {e}");
        // Only toml's own syntax message spans lines (its caret line).
        assert!(is_toml || !e.contains('\n'), "one line: {e}");
    }
}

#[test]
fn a_toml_syntax_error_shows_the_line_and_a_caret() {
    let e = Config::from_toml("[host]\ncores = 0-1\n", "my.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("my.toml: "), "{e}");
    assert!(e.contains("line 2"), "{e}");
    assert!(e.contains("cores = 0-1"), "{e}");
    assert!(
        e.lines()
            .any(|l| l.trim_start_matches([' ', '|']).starts_with('^')),
        "{e}"
    );
}

#[test]
fn guest_stage_matching() {
    let r =
        resolve_text("[[stage]]\nname = \"parse\"\nmax_cores = 1\n[[stage]]\nname = \"commit\"")
            .unwrap();
    let guest = vec!["parse".to_string(), "plan".to_string()];
    let e = r.budgets_for(&guest).unwrap_err().to_string();
    assert!(
        e.contains("stage 'commit': unknown stage; the guest declared parse, plan"),
        "{e}"
    );
    let r = resolve_text("[[stage]]\nname = \"parse\"\nmax_cores = 1").unwrap();
    let b = r.budgets_for(&guest).unwrap();
    assert_eq!((b[0].max_cores, b[1].max_cores), (1, 4));
    let r = resolve_text(
        "[[stage]]\nname = \"parse\"\nmax_cores = 1\n[[stage]]\nname = \"plan\"\nmax_cores = 1",
    )
    .unwrap();
    assert!(r
        .budgets_for(&guest)
        .unwrap_err()
        .to_string()
        .contains("max_cores sum to 2"));
}

/// A REGISTER never fails on the configuration: budgets for stages the
/// guest did not declare are left out, and what still does not fit is
/// served by `off` (host_sched::vm::guest_policy).
#[test]
fn guest_policy_never_fails_on_guest_stage_names() {
    use crate::vm::guest_policy;
    let guest = vec!["parse".to_string(), "plan".to_string()];
    // Fits: no warning, the configured policy.
    let r = resolve_text("[policy]\nname = \"static\"\n[[stage]]\nname = \"parse\"").unwrap();
    let (p, w) = guest_policy(&r, 4, &guest);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(p.kind(), PolicyKind::Static);
    // A stage the guest did not declare: left out, still static.
    let r = resolve_text(
        "[policy]\nname = \"static\"\n[[stage]]\nname = \"parse\"\nmax_cores = 1\n[[stage]]\nname = \"commit\"",
    )
    .unwrap();
    let (p, w) = guest_policy(&r, 4, &guest);
    assert_eq!(p.kind(), PolicyKind::Static);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("stage 'commit': unknown stage")
            && w[0].contains("budgets of commit are left out"),
        "{w:?}"
    );
    // Still does not fit after that (max budgets use 2 of 4 cores): off.
    let r = resolve_text(
        "[policy]\nname = \"static\"\n[[stage]]\nname = \"parse\"\nmax_cores = 1\n[[stage]]\nname = \"plan\"\nmax_cores = 1",
    )
    .unwrap();
    let (p, w) = guest_policy(&r, 4, &guest);
    assert_eq!(p.kind(), PolicyKind::Off);
    assert!(w[0].contains("served by policy off"), "{w:?}");
    // An untrusted guest's names: none matches, every budget left out.
    let hostile = vec!["\u{1b}[31m".to_string()];
    let (p, w) = guest_policy(&r, 4, &hostile);
    assert_eq!(p.kind(), PolicyKind::Static);
    assert!(
        w[0].contains("budgets of parse, plan are left out"),
        "{w:?}"
    );
}

#[test]
fn overrides_folded_in_resolve_like_the_command_line() {
    let config =
        Config::from_toml("[host]\ncores = \"0-3\"\n[policy]\nname = \"static\"", "t").unwrap();
    let overrides = Overrides {
        cores: Some("1-2".into()),
        housekeeping: Some("0".into()),
        policy: Some("pinned".into()),
        visit: Some("cohort".into()),
    };
    let with_cli = resolve(&config, &overrides, &topo()).unwrap();
    let folded = resolve(
        &config.with_overrides(&overrides),
        &Overrides::default(),
        &topo(),
    )
    .unwrap();
    assert_eq!(folded.stage_cores, with_cli.stage_cores);
    assert_eq!(folded.housekeeping, with_cli.housekeeping);
    assert_eq!(folded.policy, PolicyKind::Pinned);
}

#[test]
fn api_changes_are_validated_like_the_file() {
    let guest: Vec<String> = ["parse", "plan"].map(String::from).to_vec();
    let base = Config::from_toml("[policy]\nname = \"static\"\nperiod_ms = 20", "t").unwrap();
    let replan = |c: &Config| crate::vm::replan(c, &topo(), 4, Some(&guest));
    // A policy change keeps the parameters it does not name.
    let update: PolicyUpdate =
        serde_json::from_str(r#"{"name":"proportional","smoothing":0.5}"#).unwrap();
    let vm = replan(&base.clone().with_policy(&update)).unwrap();
    assert_eq!(vm.resolved.policy, PolicyKind::Proportional);
    assert_eq!(
        (vm.resolved.smoothing, vm.resolved.period),
        (0.5, Duration::from_millis(20))
    );
    assert_eq!(update.describe(), "policy proportional, smoothing 0.5");
    // The latency bound, live: a fraction, an SLO, and 0 removing the SLO.
    let update: PolicyUpdate =
        serde_json::from_str(r#"{"name":"auto","max_p99_increase":0.25,"latency_slo_us":1500}"#)
            .unwrap();
    let with = base.clone().with_policy(&update);
    let vm = replan(&with).unwrap();
    assert_eq!(vm.resolved.latency.max_p99_increase, 0.25);
    assert_eq!(vm.resolved.latency.slo_ns, Some(1_500_000.0));
    assert_eq!(
        update.describe(),
        "policy auto, max_p99_increase 0.25, latency_slo_us 1500"
    );
    let clear: PolicyUpdate =
        serde_json::from_str(r#"{"name":"auto","latency_slo_us":0}"#).unwrap();
    let vm = replan(&with.clone().with_policy(&clear)).unwrap();
    assert_eq!(vm.resolved.latency.slo_ns, None);
    assert_eq!(vm.resolved.latency.max_p99_increase, 0.25);
    let bad: PolicyUpdate =
        serde_json::from_str(r#"{"name":"auto","max_p99_increase":-1}"#).unwrap();
    let e = replan(&base.clone().with_policy(&bad))
        .unwrap_err()
        .to_string();
    assert!(e.contains("policy.max_p99_increase = -1"), "{e}");
    // Budgets replace [host] and every [[stage]], with the file's messages.
    let cases = [
        (
            r#"{"host":{"cores":"0-9"}}"#,
            "host.cores = '0-9': CPU 4 is not online",
        ),
        (
            r#"{"stage":[{"name":"commit"}]}"#,
            "stage 'commit': unknown stage; the guest declared parse, plan",
        ),
        (
            r#"{"stage":[{"name":"parse","max_cores":1},{"name":"plan","max_cores":1}]}"#,
            "max_cores sum to 2",
        ),
        (r#"{"stage":[{"name":"parse","weight":-1}]}"#, "weight = -1"),
    ];
    for (json, needle) in cases {
        let update: BudgetsUpdate = serde_json::from_str(json).unwrap();
        let e = replan(&base.clone().with_budgets(&update))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{json}: {e}");
    }
    let update: BudgetsUpdate = serde_json::from_str(
        r#"{"host":{"cores":"2-3"},"stage":[{"name":"parse","min_cores":1}]}"#,
    )
    .unwrap();
    let vm = replan(&base.clone().with_budgets(&update)).unwrap();
    assert_eq!(
        (
            vm.resolved.stage_cores.to_string(),
            vm.resolved.housekeeping.to_string()
        ),
        ("2-3".into(), "0-1".into())
    );
    assert_eq!(
        update.describe(),
        "budgets: cores 2-3, housekeeping default, stages [parse 1..all ×1]"
    );
    // Cores alone keep the stages; `[]` removes them.
    let with_stage = base.clone().with_budgets(&update);
    let cores_only: BudgetsUpdate = serde_json::from_str(r#"{"host":{"cores":"1"}}"#).unwrap();
    assert_eq!(
        cores_only.describe(),
        "budgets: cores 1, housekeeping default, stages kept"
    );
    assert_eq!(with_stage.clone().with_budgets(&cores_only).stages.len(), 1);
    let cleared: BudgetsUpdate = serde_json::from_str(r#"{"stage":[]}"#).unwrap();
    assert!(with_stage.with_budgets(&cleared).stages.is_empty());
    // Unknown fields are refused, as in the file.
    assert!(serde_json::from_str::<PolicyUpdate>(r#"{"name":"off","speed":1}"#).is_err());
    assert!(serde_json::from_str::<BudgetsUpdate>(r#"{"policy":{}}"#).is_err());
}

/// Whether `auto` built from `text` plans a spatial map within 200
/// periods of equal rates (a 4-core VM, 2 stages).
fn auto_plans_spatial(text: &str) -> bool {
    let r = resolve_text(text).unwrap();
    let ctx = r.context(4, r.budgets_for(&["a".into(), "b".into()]).unwrap());
    let mut p = crate::policy::build(PolicyKind::Auto, ctx);
    (0..200).any(|i| {
        p.observe(&crate::policy::Observation::rate(1000.0 + f64::from(i % 7)));
        p.plan(&[0.5, 0.5]).stage_vcpus.iter().any(|v| *v != 0b1111)
    })
}

#[test]
fn auto_modes_choose_what_auto_trials_and_a_bad_one_is_named() {
    use crate::policy::auto::{Mode, Modes};
    assert_eq!(resolve_text("").unwrap().auto_modes, Modes::ALL);
    let only = "[policy]\nname = \"auto\"\nauto_modes = [\"temporal\"]";
    let r = resolve_text(only).unwrap();
    assert_eq!(r.auto_modes, Modes::of(&[Mode::Unstaged, Mode::Temporal]));
    // The policy built from it never plans spatial staging; by default it
    // trials it.
    assert!(!auto_plans_spatial(only));
    assert!(auto_plans_spatial("[policy]\nname = \"auto\""));
    let e = resolve_text("[policy]\nauto_modes = [\"temporal\", \"fast\"]").unwrap_err();
    assert!(
        e.to_string().contains("'fast' is not a mode auto trials"),
        "{e}"
    );
}

#[test]
fn auto_twin_runs_the_null_experiment_unstaged_named_temporal() {
    assert!(!resolve_text("").unwrap().auto_twin);
    let r = resolve_text("[policy]\nname = \"auto\"\nauto_twin = true").unwrap();
    assert!(r.auto_twin);
    let ctx = r.context(4, r.budgets_for(&["a".into(), "b".into()]).unwrap());
    let mut p = crate::policy::build(PolicyKind::Auto, ctx);
    // Equal rates: its trials duel `temporal` (unstaged under that name)
    // against unstaged; no plan ever stages, in space or in time.
    for i in 0..400 {
        p.observe(&crate::policy::Observation::rate(1000.0 + f64::from(i % 7)));
        let plan = p.plan(&[0.5, 0.5]);
        assert!(plan.stage_vcpus.iter().all(|v| *v == 0b1111), "{plan:?}");
        assert!(!plan.visit.is_temporal(), "{plan:?}");
    }
    let last = p.last_trial().expect("a trial ended in 400 periods");
    assert!(
        last.duels
            .iter()
            .all(|d| (d.candidate, d.incumbent) == ("temporal", "unstaged")),
        "{last:?}"
    );
    let stats = p.auto_stats().unwrap();
    // Rates within 0.6 % of each other: no duel finds a difference.
    assert!(stats.duels >= 1 && stats.duels_better == 0, "{stats:?}");
}

#[test]
fn the_embedded_default_is_the_test_guests_three_stages_under_static() {
    let c = Config::default_stages();
    let names: Vec<&str> = c.stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["parse", "plan", "execute"]);
    assert_eq!(Config::load_or_default(None).unwrap(), c);
    let r = resolve(&c, &Overrides::default(), &topo()).unwrap();
    assert_eq!(r.policy, PolicyKind::Static);
}
