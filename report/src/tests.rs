//! Tests of the report types: escaping, schema versions.

use super::*;

/// A guest stage name with an escape sequence and a forged line shows as
/// one inert line (issue 14 D7).
#[test]
fn guest_names_cannot_forge_terminal_output() {
    let name = "x\u{1b}[2J\nstagevm: forged";
    let channel = ChannelReport {
        registrations: 1,
        stages: vec![StageStats {
            name: name.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let sched = SchedReport {
        policy: "static".into(),
        visit: "fifo".into(),
        period_ms: 20,
        stage_cores: "0".into(),
        housekeeping: "0".into(),
        warnings: vec![],
        stages: vec![],
        vcpus: vec![],
        helpers: vec![],
        map_changes: 0,
        policy_kept: 0,
        repins: 0,
        repin_mean_us: 0.0,
        timeline: vec![],
        timeline_dropped: 0,
        auto: None,
        cpu: None,
        max_p99_increase: 0.1,
        latency_slo_us: None,
        cpu_weight: None,
    };
    let text = summary(Some(&channel), &sched, &[]);
    assert!(!text.contains('\u{1b}'), "{text}");
    assert!(text
        .lines()
        .all(|l| l.starts_with("stagevm: ") || l.starts_with("stagevm:   ")));
    assert!(!text.lines().any(|l| l == "stagevm: forged"));
    assert!(text.contains(r"x\u{1b}[2J\nstagevm: forged"), "{text}");
}

/// A schema-1 report (stage-indexed timeline arrays) as stop 31 wrote
/// it, cut to the fields every report has.
const SCHEMA_1: &str = r#"{"schema": 1, "exit_code": 0, "exit": "guest shutdown",
    "stage_channel": null, "disks": [],
    "sched": {"policy": "static", "period_ms": 20, "stage_cores": "0-1",
      "housekeeping": "0-1", "warnings": [],
      "stages": [{"name": "parse", "vcpus": [0], "cores": "0", "requirement": 1},
                 {"name": "plan", "vcpus": [1], "cores": "1", "requirement": 1}],
      "vcpus": [], "helpers": [], "map_changes": 1, "repins": 0, "repin_mean_us": 0.0,
      "timeline": [{"t_ms": 20.0, "load": [0.75, 0.25], "requirement": [1, 1],
                    "map_changed": true}],
      "timeline_dropped": 0}}"#;

#[test]
fn a_schema_1_report_reads_with_stage_names() {
    let r = Report::from_json(SCHEMA_1).unwrap();
    let e = &r.sched.timeline[0];
    assert_eq!(e.load.get("parse"), Some(&0.75));
    assert_eq!(e.requirement.get("plan"), Some(&1));
    // Written again, it is a schema-2 object keyed by name.
    let mut again = r.clone();
    again.schema = REPORT_SCHEMA;
    let text = serde_json::to_string(&again).unwrap();
    assert!(
        text.contains(r#""load":{"parse":0.75,"plan":0.25}"#),
        "{text}"
    );
    let back = Report::from_json(&text).unwrap();
    assert_eq!(back.sched.timeline[0].load, e.load);
}

#[test]
fn a_newer_schema_is_refused_naming_both_versions() {
    let newer = SCHEMA_1.replacen(r#""schema": 1"#, r#""schema": 99"#, 1);
    let e = Report::from_json(&newer).unwrap_err().to_string();
    assert!(
        e.contains("schema 99") && e.contains(&format!("({REPORT_SCHEMA})")),
        "{e}"
    );
}
