//! The stage-visit policies (ABI minor 3, [`super::StageMap::visit`]):
//! which runnable thread a vCPU's scheduler resumes next, by the stage it
//! is about to run. Spatial staging (the map's masks) decides *where* a
//! stage runs; the visit policy decides *when*, on each vCPU: serving the
//! threads queued for one stage back to back runs that stage's code on the
//! core over and over (temporal staging: i-cache locality without a
//! migration, seed 002 ch. 3).
//!
//! The orders themselves are the guest's (`guest_agent::visit`); the ABI
//! only names them.

/// A stage-visit policy (seed 002, Gordon, Cambridge TR-781; section of
/// each below). Codes are stable ABI values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum VisitPolicy {
    /// 0: one run queue in arrival order; a thread runs its whole request
    /// (every stage the vCPU serves) before the next thread runs — an OS's
    /// scheduler, no temporal staging.
    #[default]
    Fifo = 0,
    /// 1: Cohort scheduling (Larus & Parkes 2002; seed 002 §2.4.2): an
    /// elevator over the stages, each stage's queue drained before the
    /// next, with a jump to a stage whose queue or wait exceeds a
    /// threshold.
    Cohort = 1,
    /// 2: SRPT (seed 002 §3.1.2): the pipeline's last stage first, working
    /// back to the first; after a successful visit, start at the end again.
    Srpt = 2,
    /// 3: Drum-Buffer-Rope (seed 002 §3.1.3): the slowest stage (measured
    /// service time) first; re-sorted after each pass without success.
    Dbr = 3,
    /// 4: MG1 (seed 002 §3.1.1): a polling table that visits each stage
    /// with Boxma's efficient frequencies from its load ρ = λ/μ.
    Mg1 = 4,
    /// 5: Color (seed 002 §3.1.4): one queue shared by the vCPUs, each
    /// entry tagged with its stage, served in arrival order.
    Color = 5,
}

impl VisitPolicy {
    /// Every policy, in code order.
    pub const ALL: [VisitPolicy; 6] = [
        Self::Fifo,
        Self::Cohort,
        Self::Srpt,
        Self::Dbr,
        Self::Mg1,
        Self::Color,
    ];

    /// The policy's ABI code ([`super::StageMap::visit`]).
    pub const fn code(self) -> u64 {
        self as u64
    }

    /// The policy of an ABI code; `None` for a code this side does not
    /// know (a guest then serves FIFO).
    pub fn from_code(code: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.code() == code)
    }

    /// Its lower-case name (`fifo`, `cohort`, `srpt`, `dbr`, `mg1`,
    /// `color`), as in a `--stages` file.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Cohort => "cohort",
            Self::Srpt => "srpt",
            Self::Dbr => "dbr",
            Self::Mg1 => "mg1",
            Self::Color => "color",
        }
    }

    /// The policy named `name` (see [`VisitPolicy::name`]).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// True for every policy but FIFO: threads yield at every stage switch
    /// so the scheduler can order the visits.
    pub const fn is_temporal(self) -> bool {
        !matches!(self, Self::Fifo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip() {
        for p in VisitPolicy::ALL {
            assert_eq!(VisitPolicy::from_code(p.code()), Some(p));
            assert_eq!(VisitPolicy::parse(p.name()), Some(p));
        }
        assert_eq!(VisitPolicy::from_code(6), None);
        assert_eq!(VisitPolicy::parse("FIFO"), None);
        assert!(!VisitPolicy::Fifo.is_temporal() && VisitPolicy::Color.is_temporal());
    }
}
