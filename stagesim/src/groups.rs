//! Stage grouping at replay time: merging a trace's stages into coarser
//! groups (`stagesim replay --stage-groups SPEC`).
//!
//! A trace's stage map may be finer than a good migration granularity: the
//! hand-written MariaDB map has 9 stages and a thread changes stage about
//! every 1,200 instructions. A grouping replays the same trace *as if it had
//! been captured with a coarser map*: a thread is in group G while it is in
//! any stage of G, and a STAGE marker between two stages of the same group is
//! no stage change at all (no migration check, no new visit). The tracer
//! emits a marker only when the stage changes, so this is exactly what a
//! capture with the merged map would have recorded.
//!
//! ## Spec
//! `NAME=STAGE,STAGE,…;NAME=…`, e.g.
//! `front=net_read,dispatch,parse;plan=open_lock,optimize;exec=execute,innodb;finish=commit,send`.
//! * Every listed stage must be a stage of the trace (by name), and may
//!   appear in one group only.
//! * Stages not listed stay groups of their own (same name), after the listed
//!   groups, in trace order.
//! * Group names must be unique, non-empty and differ from the names of the
//!   unlisted stages; a group lists at least one stage.
//! * Code outside every stage stays outside every group.
//! * The spec `-` (or an empty spec) is the identity: the trace's own stages.

use anyhow::{bail, ensure};

use crate::stream::StageInfo;

/// A grouping of a trace's stages.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StageGroups {
    /// The spec it was parsed from (`-` for the identity).
    pub spec: String,
    /// Group names; the dense group index is the position here.
    pub names: Vec<String>,
    /// For each trace stage (dense index), its group; `map.len()` = the
    /// trace's stage count. "No stage" (index `map.len()`) maps to
    /// `names.len()`.
    pub map: Vec<usize>,
    /// For each group, the trace stages it holds (by name).
    pub members: Vec<Vec<String>>,
}

impl StageGroups {
    /// The identity grouping: every stage its own group.
    pub fn identity(stages: &[StageInfo]) -> Self {
        Self {
            spec: "-".into(),
            names: stages.iter().map(|s| s.name.clone()).collect(),
            map: (0..stages.len()).collect(),
            members: stages.iter().map(|s| vec![s.name.clone()]).collect(),
        }
    }

    /// Parses `spec` (module docs) against the trace's `stages`.
    pub fn parse(spec: &str, stages: &[StageInfo]) -> anyhow::Result<Self> {
        let spec = spec.trim();
        if spec.is_empty() || spec == "-" {
            return Ok(Self::identity(stages));
        }
        let mut map: Vec<Option<usize>> = vec![None; stages.len()];
        let mut names: Vec<String> = Vec::new();
        let mut members: Vec<Vec<String>> = Vec::new();
        for part in spec.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((name, list)) = part.split_once('=') else {
                bail!("--stage-groups '{part}': expected NAME=STAGE,STAGE,…");
            };
            let name = name.trim();
            ensure!(
                !name.is_empty(),
                "--stage-groups '{part}': empty group name"
            );
            ensure!(
                !names.iter().any(|n| n == name),
                "--stage-groups: group '{name}' defined twice"
            );
            let g = names.len();
            let mut mem = Vec::new();
            for st in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let Some(i) = stages.iter().position(|s| s.name == st) else {
                    bail!(
                        "--stage-groups: '{st}' (group '{name}') is not a stage of the trace (stages: {})",
                        stages
                            .iter()
                            .map(|s| s.name.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    );
                };
                if let Some(prev) = map[i] {
                    bail!(
                        "--stage-groups: stage '{st}' is in group '{}' and in group '{name}'",
                        names.get(prev).map_or(name, |n| n.as_str())
                    );
                }
                map[i] = Some(g);
                mem.push(st.to_string());
            }
            ensure!(
                !mem.is_empty(),
                "--stage-groups: group '{name}' lists no stage"
            );
            names.push(name.to_string());
            members.push(mem);
        }
        ensure!(!names.is_empty(), "--stage-groups '{spec}': no group");
        for (i, s) in stages.iter().enumerate() {
            if map[i].is_none() {
                ensure!(
                    !names.contains(&s.name),
                    "--stage-groups: group name '{}' is also an ungrouped stage's name",
                    s.name
                );
                map[i] = Some(names.len());
                names.push(s.name.clone());
                members.push(vec![s.name.clone()]);
            }
        }
        Ok(Self {
            spec: spec.to_string(),
            names,
            map: map.into_iter().map(|g| g.unwrap_or(0)).collect(),
            members,
        })
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there is no group (a trace without stages).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Whether this is the identity grouping.
    pub fn is_identity(&self) -> bool {
        self.map.iter().enumerate().all(|(i, g)| i == *g) && self.names.len() == self.map.len()
    }

    /// The group of trace stage `s` (dense); "no stage" (`s ≥ map.len()`)
    /// gives `len()`.
    #[inline]
    pub fn group_of(&self, s: usize) -> usize {
        self.map.get(s).copied().unwrap_or(self.names.len())
    }

    /// Table of trace stage (dense, plus "no stage" last) → group (plus "no
    /// group" last), for the replay loop.
    pub fn lookup(&self) -> Vec<usize> {
        let mut v = self.map.clone();
        v.push(self.names.len());
        v
    }

    /// A short label: `hand(9)` for the identity, else the group names
    /// joined by `+` with the count, e.g. `front+plan+exec+finish(4)`.
    pub fn label(&self) -> String {
        if self.is_identity() {
            format!("stages({})", self.len())
        } else {
            format!("{}({})", self.names.join("+"), self.len())
        }
    }

    /// The spec of this grouping with every group written out (unlisted
    /// stages included), e.g. for the results.
    pub fn full_spec(&self) -> String {
        self.names
            .iter()
            .zip(&self.members)
            .map(|(n, m)| format!("{n}={}", m.join(",")))
            .collect::<Vec<_>>()
            .join(";")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stages(names: &[&str]) -> Vec<StageInfo> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| StageInfo {
                id: i as u16,
                name: n.to_string(),
            })
            .collect()
    }

    const MARIADB: [&str; 9] = [
        "net_read",
        "dispatch",
        "parse",
        "open_lock",
        "optimize",
        "execute",
        "innodb",
        "commit",
        "send",
    ];

    #[test]
    fn four_groups_of_the_mariadb_map() {
        let st = stages(&MARIADB);
        let g = StageGroups::parse(
            "front=net_read,dispatch,parse;plan=open_lock,optimize;exec=execute,innodb;finish=commit,send",
            &st,
        )
        .unwrap();
        assert_eq!(g.names, ["front", "plan", "exec", "finish"]);
        assert_eq!(g.map, [0, 0, 0, 1, 1, 2, 2, 3, 3]);
        assert_eq!(g.group_of(9), 4, "no stage stays outside every group");
        assert_eq!(g.lookup(), [0, 0, 0, 1, 1, 2, 2, 3, 3, 4]);
        assert_eq!(g.len(), 4);
        assert!(!g.is_identity());
        assert_eq!(g.label(), "front+plan+exec+finish(4)");
        assert_eq!(g.members[2], ["execute", "innodb"]);
    }

    #[test]
    fn unlisted_stages_stay_their_own_groups_in_trace_order() {
        let st = stages(&MARIADB);
        let g = StageGroups::parse(" sql = parse , optimize ; ", &st).unwrap();
        assert_eq!(
            g.names,
            [
                "sql",
                "net_read",
                "dispatch",
                "open_lock",
                "execute",
                "innodb",
                "commit",
                "send"
            ]
        );
        assert_eq!(g.map, [1, 2, 0, 3, 0, 4, 5, 6, 7]);
        assert_eq!(
            g.full_spec(),
            "sql=parse,optimize;net_read=net_read;dispatch=dispatch;open_lock=open_lock;execute=execute;innodb=innodb;commit=commit;send=send"
        );
    }

    #[test]
    fn identity_spec() {
        let st = stages(&MARIADB);
        for spec in ["", "-", "  - "] {
            let g = StageGroups::parse(spec, &st).unwrap();
            assert!(g.is_identity());
            assert_eq!(g, StageGroups::identity(&st));
            assert_eq!(g.label(), "stages(9)");
            assert_eq!(g.group_of(3), 3);
        }
        // Listing every stage alone in order is the identity too.
        let g = StageGroups::parse("a=a;b=b", &stages(&["a", "b"])).unwrap();
        assert!(g.is_identity());
    }

    #[test]
    fn bad_specs_are_errors() {
        let st = stages(&MARIADB);
        for (spec, msg) in [
            (
                "front=net_read,nosuch",
                "'nosuch' (group 'front') is not a stage",
            ),
            (
                "a=parse;b=parse",
                "stage 'parse' is in group 'a' and in group 'b'",
            ),
            (
                "a=parse,parse",
                "stage 'parse' is in group 'a' and in group 'a'",
            ),
            ("a=parse;a=send", "group 'a' defined twice"),
            ("a=", "group 'a' lists no stage"),
            ("parse", "expected NAME=STAGE"),
            ("=parse", "empty group name"),
            ("send=parse", "also an ungrouped stage's name"),
            (";;", "no group"),
        ] {
            let e = StageGroups::parse(spec, &st).unwrap_err().to_string();
            assert!(e.contains(msg), "{spec}: {e}");
        }
    }
}
