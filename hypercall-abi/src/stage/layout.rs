//! Where each part of a registered area lies: the fixed offsets of the
//! header's neighbours, the [`Layout`] computed from a header's counts (rings,
//! then counter blocks, then latency blocks), and [`validate_header`], the
//! check the host makes of a guest's header before it trusts any count.

use super::{
    AreaHeader, RingHeader, StageEvent, Status, VcpuCounters, VcpuLatency, ABI_VERSION,
    AREA_FLAG_COUNTERS, AREA_FLAG_LATENCY, AREA_MAGIC, MAX_RING_ENTRIES, MAX_STAGES, MAX_VCPUS,
    PAGE_SIZE,
};

/// Alignment of the first counter block (bytes): a pair of cache lines, the
/// unit the adjacent-line prefetcher moves, so two vCPUs' blocks never share
/// one (each block is a multiple of 128 bytes).
pub const COUNTERS_ALIGN: u64 = 128;

/// Offset of the stage descriptors (bytes).
pub const STAGE_DESCS_OFFSET: u64 = 64;
/// Offset of the stage map (bytes).
pub const STAGE_MAP_OFFSET: u64 = STAGE_DESCS_OFFSET + (MAX_STAGES * 32) as u64;
/// Offset of the per-vCPU states (bytes).
pub const VCPU_STATES_OFFSET: u64 = STAGE_MAP_OFFSET + 192;
/// Offset of the first ring (bytes).
pub const RINGS_OFFSET: u64 = VCPU_STATES_OFFSET + (MAX_VCPUS * 64) as u64;

const _: () = assert!(RINGS_OFFSET == 4864);

/// Byte offsets of one area's parts, computed from its header's counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Number of vCPUs (rings).
    pub num_vcpus: u32,
    /// Number of stages.
    pub num_stages: u32,
    /// Entries per ring.
    pub ring_entries: u32,
    /// Whether per-vCPU [`VcpuCounters`] follow the rings (minor 2,
    /// [`AREA_FLAG_COUNTERS`]).
    pub counters: bool,
    /// Whether per-vCPU [`VcpuLatency`] blocks follow the counter blocks
    /// (minor 4, [`AREA_FLAG_LATENCY`]; only with `counters`).
    pub latency: bool,
}

impl Layout {
    /// Checks the counts (see [`Status::BadLayout`]) and returns the layout
    /// of a rings-only area (no counters; see [`Self::with_counters`]).
    pub fn new(num_vcpus: u32, num_stages: u32, ring_entries: u32) -> Option<Self> {
        let ok = (1..=MAX_VCPUS as u32).contains(&num_vcpus)
            && (1..=MAX_STAGES as u32).contains(&num_stages)
            && (2..=MAX_RING_ENTRIES).contains(&ring_entries)
            && ring_entries.is_power_of_two();
        ok.then_some(Self {
            num_vcpus,
            num_stages,
            ring_entries,
            counters: false,
            latency: false,
        })
    }

    /// The same layout with per-vCPU counters after the rings (minor 2).
    pub fn with_counters(self) -> Self {
        Self {
            counters: true,
            ..self
        }
    }

    /// The same layout with per-vCPU counters and, after them, per-vCPU
    /// latency histograms (minor 4).
    pub fn with_latency(self) -> Self {
        Self {
            counters: true,
            latency: true,
            ..self
        }
    }

    /// Offset of vCPU `vcpu`'s [`VcpuLatency`]: right after the last
    /// counter block (a multiple of [`LATENCY_ALIGN`](super::LATENCY_ALIGN), 128 bytes, as every
    /// counter block is), blocks back to back (each 2,176 bytes). Only
    /// meaningful when [`Self::latency`].
    pub fn latency_offset(&self, vcpu: u32) -> u64 {
        self.counters_offset(self.num_vcpus)
            + u64::from(vcpu) * core::mem::size_of::<VcpuLatency>() as u64
    }

    /// Offset of vCPU `vcpu`'s [`VcpuCounters`]: after the last ring,
    /// rounded up to [`COUNTERS_ALIGN`] (128 bytes), blocks back to back
    /// (each 768 bytes). Only meaningful when [`Self::counters`].
    pub fn counters_offset(&self, vcpu: u32) -> u64 {
        self.ring_offset(self.num_vcpus)
            .next_multiple_of(COUNTERS_ALIGN)
            + u64::from(vcpu) * core::mem::size_of::<VcpuCounters>() as u64
    }

    /// Bytes one vCPU's ring takes: header plus entries.
    pub fn ring_bytes(&self) -> u64 {
        core::mem::size_of::<RingHeader>() as u64
            + u64::from(self.ring_entries) * core::mem::size_of::<StageEvent>() as u64
    }

    /// Offset of vCPU `vcpu`'s [`VcpuState`](super::VcpuState).
    pub fn vcpu_state_offset(vcpu: u32) -> u64 {
        VCPU_STATES_OFFSET + 64 * u64::from(vcpu)
    }

    /// Offset of vCPU `vcpu`'s [`RingHeader`].
    pub fn ring_offset(&self, vcpu: u32) -> u64 {
        RINGS_OFFSET + u64::from(vcpu) * self.ring_bytes()
    }

    /// Offset of the event slot for free-running index `index` in `vcpu`'s ring.
    pub fn slot_offset(&self, vcpu: u32, index: u64) -> u64 {
        self.ring_offset(vcpu)
            + core::mem::size_of::<RingHeader>() as u64
            + (index & u64::from(self.ring_entries - 1)) * core::mem::size_of::<StageEvent>() as u64
    }

    /// Bytes the layout needs: the end of the last ring, or of the last
    /// counter block with [`Self::counters`], or of the last latency block
    /// with [`Self::latency`].
    pub fn used_bytes(&self) -> u64 {
        if self.latency {
            self.latency_offset(self.num_vcpus)
        } else if self.counters {
            self.counters_offset(self.num_vcpus)
        } else {
            self.ring_offset(self.num_vcpus)
        }
    }

    /// Smallest page-multiple area size that holds the layout.
    pub fn area_size(&self) -> u64 {
        self.used_bytes().next_multiple_of(PAGE_SIZE)
    }

    /// The valid header for this layout in an area of [`Self::area_size`]
    /// bytes (`tsc_khz` 0: the host fills it in).
    pub fn header(&self) -> AreaHeader {
        AreaHeader {
            magic: AREA_MAGIC,
            version: ABI_VERSION,
            header_size: core::mem::size_of::<AreaHeader>() as u32,
            area_size: self.area_size(),
            num_vcpus: self.num_vcpus,
            num_stages: self.num_stages,
            ring_entries: self.ring_entries,
            flags: match (self.counters, self.latency) {
                (true, true) => AREA_FLAG_COUNTERS | AREA_FLAG_LATENCY,
                (true, false) => AREA_FLAG_COUNTERS,
                _ => 0,
            },
            ..Default::default()
        }
    }
}

/// The stage-map mask with every one of `num_vcpus` vCPUs set (all 64 bits
/// from [`MAX_VCPUS`] vCPUs on).
pub fn all_vcpus_mask(num_vcpus: u32) -> u64 {
    if num_vcpus >= MAX_VCPUS as u32 {
        u64::MAX
    } else {
        (1u64 << num_vcpus) - 1
    }
}

/// Validates a header the guest wrote for a VM with `vm_vcpus` vCPUs; returns
/// the layout or the status to refuse it with. Pure: used by the VMM and by
/// property tests.
pub fn validate_header(h: &AreaHeader, vm_vcpus: u32) -> Result<Layout, Status> {
    if h.magic != AREA_MAGIC {
        return Err(Status::BadMagic);
    }
    if h.version != ABI_VERSION {
        return Err(Status::BadVersion);
    }
    if h.area_size == 0 || !h.area_size.is_multiple_of(PAGE_SIZE) {
        return Err(Status::BadAlignment);
    }
    if h.header_size as usize != core::mem::size_of::<AreaHeader>() || h.num_vcpus != vm_vcpus {
        return Err(Status::BadLayout);
    }
    let mut layout =
        Layout::new(h.num_vcpus, h.num_stages, h.ring_entries).ok_or(Status::BadLayout)?;
    if h.flags & AREA_FLAG_COUNTERS != 0 {
        layout = if h.flags & AREA_FLAG_LATENCY != 0 {
            layout.with_latency()
        } else {
            layout.with_counters()
        };
    }
    if layout.used_bytes() > h.area_size {
        return Err(Status::BadLayout);
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::super::LATENCY_ALIGN;
    use super::*;

    fn header(vcpus: u32, stages: u32, entries: u32) -> AreaHeader {
        Layout::new(vcpus, stages, entries).unwrap().header()
    }

    #[test]
    fn layout_sizes() {
        let l = Layout::new(2, 3, 256).unwrap();
        assert_eq!(l.ring_bytes(), 192 + 256 * 32);
        assert_eq!(l.ring_offset(1), 4864 + 8384);
        assert_eq!(l.slot_offset(0, 257), 4864 + 192 + 32);
        assert_eq!(l.area_size() % PAGE_SIZE, 0);
        assert!(Layout::new(0, 3, 256).is_none());
        assert!(Layout::new(65, 3, 256).is_none());
        assert!(Layout::new(2, 17, 256).is_none());
        assert!(Layout::new(2, 3, 100).is_none());
        assert!(Layout::new(2, 3, 1 << 17).is_none());
        // Minor 2: the counter blocks follow the last ring.
        let c = l.with_counters();
        assert_eq!(c.counters_offset(0), l.used_bytes());
        // An odd vCPU count ends its rings on a 64-byte boundary only: the
        // counters start at the next 128.
        let odd = Layout::new(1, 3, 256).unwrap().with_counters();
        assert_eq!(odd.ring_offset(1) % 128, 64);
        assert_eq!(odd.counters_offset(0), odd.ring_offset(1) + 64);
        assert_eq!(c.counters_offset(1), l.used_bytes() + 768);
        assert_eq!(c.used_bytes(), l.used_bytes() + 2 * 768);
        assert_eq!(c.counters_offset(1) % 64, 0);
        assert_eq!(c.header().flags, AREA_FLAG_COUNTERS);
        assert_eq!(validate_header(&c.header(), 2), Ok(c));
        // A counters flag in an area sized for the rings only is refused:
        // 8 vCPUs of 2 entries end their rings at 6,912 bytes and their
        // counters at 13,056.
        let small = Layout::new(8, 3, 2).unwrap();
        let mut h = small.with_counters().header();
        h.area_size = 2 * PAGE_SIZE;
        assert!(small.used_bytes() <= h.area_size);
        assert_eq!(validate_header(&h, 8), Err(Status::BadLayout));
        h.flags = 0;
        assert_eq!(validate_header(&h, 8), Ok(small));
        // Minor 4: the latency blocks follow the counter blocks; the flag
        // alone (without counters) is ignored.
        let lat = l.with_latency();
        assert_eq!(lat.latency_offset(0), c.used_bytes());
        assert_eq!(lat.latency_offset(0) % LATENCY_ALIGN, 0);
        assert_eq!(lat.used_bytes(), c.used_bytes() + 2 * 2176);
        assert_eq!(lat.header().flags, AREA_FLAG_COUNTERS | AREA_FLAG_LATENCY);
        assert_eq!(validate_header(&lat.header(), 2), Ok(lat));
        let mut h = l.header();
        h.flags = AREA_FLAG_LATENCY;
        assert_eq!(validate_header(&h, 2), Ok(l));
        // A latency flag in an area sized for the counters only is refused.
        let mut h = lat.header();
        h.area_size = c.area_size();
        assert!(lat.used_bytes() > h.area_size);
        assert_eq!(validate_header(&h, 2), Err(Status::BadLayout));
        // Unknown flag bits are ignored, as a v1.1 host ignored them all.
        let mut h = l.header();
        h.flags = 0x8000_0000;
        assert_eq!(validate_header(&h, 2), Ok(l));
    }

    #[test]
    fn header_validation_statuses() {
        assert!(validate_header(&header(2, 3, 256), 2).is_ok());
        let mut h = header(2, 3, 256);
        h.magic = 1;
        assert_eq!(validate_header(&h, 2), Err(Status::BadMagic));
        let mut h = header(2, 3, 256);
        h.version = 2;
        assert_eq!(validate_header(&h, 2), Err(Status::BadVersion));
        let mut h = header(2, 3, 256);
        h.area_size += 1;
        assert_eq!(validate_header(&h, 2), Err(Status::BadAlignment));
        assert_eq!(
            validate_header(&header(2, 3, 256), 4),
            Err(Status::BadLayout)
        );
        let mut h = header(2, 3, 256);
        h.area_size = PAGE_SIZE;
        assert_eq!(validate_header(&h, 2), Err(Status::BadLayout));
    }
}
