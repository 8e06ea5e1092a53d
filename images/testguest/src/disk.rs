//! Reading (and trying to write) a virtio-blk disk from ring 3 with the
//! `virtio-drivers` crate, over the virtio-mmio device the VMM announces on
//! the command line (`virtio_mmio.device=4K@0xd0000000:5`).
//!
//! Guest memory is identity-mapped, so DMA addresses are virtual addresses;
//! DMA buffers come from the boot info's free memory and are never freed.
//! Interrupts are off: the driver's blocking calls poll the used ring.

use core::ptr::NonNull;

use virtio_drivers::device::blk::{VirtIOBlk, SECTOR_SIZE};
use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
use virtio_drivers::{BufferDirection, Hal, PhysAddr};

use crate::print_line;
use crate::staged::{alloc_pages, PortIo};
use guest_agent::Platform;

/// `virtio-drivers`' view of this guest's memory.
pub struct GuestHal;

// SAFETY: DMA pages are fresh (zeroed) identity-mapped guest memory used for
// nothing else; shared buffers are identity-mapped, so their addresses are
// valid for the device as they are.
unsafe impl Hal for GuestHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let addr = alloc_pages(pages as u64 * 4096).unwrap_or_else(|| {
            println!("testguest: out of memory for virtio DMA");
            crate::shutdown(5)
        });
        (addr, NonNull::new(addr as *mut u8).unwrap())
    }

    unsafe fn dma_dealloc(_paddr: PhysAddr, _vaddr: NonNull<u8>, _pages: usize) -> i32 {
        0
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        NonNull::new(paddr as *mut u8).unwrap()
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.as_ptr() as *mut u8 as u64
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

/// Parses `4K@0xd0000000:5` (Linux's `virtio_mmio.device=` syntax) into the
/// register window's GPA and size.
pub fn parse_device(spec: &str) -> Option<(u64, usize)> {
    let (size, rest) = spec.split_once('@')?;
    let size = match size.strip_suffix(['K', 'k']) {
        Some(k) => k.parse::<usize>().ok()? * 1024,
        None => size.parse().ok()?,
    };
    let addr = rest.split(':').next()?;
    let addr = u64::from_str_radix(addr.strip_prefix("0x")?, 16).ok()?;
    Some((addr, size))
}

/// Largest bytes per read request (`diskchunk=`).
pub const MAX_CHUNK: usize = 1024 * 1024;

/// Bytes of the disk kept in memory as the staged threads' request stream.
const KEEP: usize = 16 << 20;

/// MMIO reads timed for the exit cost.
const MMIO_SAMPLES: u64 = 200;

/// Reads the whole disk at `base` in requests of `chunk` bytes and prints its FNV-1a checksum, size and
/// time; with `write`, then tries to write sector 0 back and prints whether
/// the device accepted it.
pub fn run(base: u64, size: usize, chunk: usize, write: bool, tsc_khz: u64) {
    let chunk = chunk.clamp(SECTOR_SIZE, MAX_CHUNK) / SECTOR_SIZE * SECTOR_SIZE;
    // One MMIO read exit from ring 3 (the device's magic register), timed.
    let magic = base as *const u32;
    let t0 = PortIo.tsc();
    for _ in 0..MMIO_SAMPLES {
        // SAFETY: the mapped, readable virtio-mmio register window.
        unsafe { core::ptr::read_volatile(magic) };
    }
    let mmio_ns = (PortIo.tsc() - t0) * 1_000_000 / tsc_khz.max(1) / MMIO_SAMPLES;
    let Some(header) = NonNull::new(base as *mut VirtIOHeader) else {
        return;
    };
    // SAFETY: the VMM maps `size` bytes of virtio-mmio registers at `base`
    // (user-accessible, identity-mapped); nothing else uses them.
    let transport = match unsafe { MmioTransport::new(header, size) } {
        Ok(t) => t,
        Err(e) => {
            println!(
                "testguest: disk at {:#x}: no virtio-mmio device ({:?})",
                base, e
            );
            return;
        }
    };
    let mut blk = match VirtIOBlk::<GuestHal, _>::new(transport) {
        Ok(b) => b,
        Err(e) => {
            println!("testguest: disk at {:#x}: init failed ({:?})", base, e);
            return;
        }
    };
    let sectors = blk.capacity();
    let Some(buf_addr) = alloc_pages(chunk as u64) else {
        return;
    };
    // SAFETY: `chunk` bytes just allocated, used only here.
    let buf = unsafe { core::slice::from_raw_parts_mut(buf_addr as *mut u8, chunk) };
    // The first KEEP bytes stay in memory: the staged threads take their
    // requests from them (see `staged::set_request_source`).
    let keep_len = (sectors as usize * SECTOR_SIZE).min(KEEP);
    let keep = alloc_pages(keep_len as u64).unwrap_or(0);
    let start = PortIo.tsc();
    let mut h = stage_workload::checksum::FNV1A_START;
    let mut sector = 0u64;
    let mut requests = 0u64;
    while sector < sectors {
        let n = ((sectors - sector) as usize * SECTOR_SIZE).min(chunk);
        if let Err(e) = blk.read_blocks(sector as usize, &mut buf[..n]) {
            println!("testguest: disk read at sector {} failed: {:?}", sector, e);
            return;
        }
        h = stage_workload::checksum::fnv1a_continue(h, &buf[..n]);
        let at = sector as usize * SECTOR_SIZE;
        if keep != 0 && at < keep_len {
            let m = n.min(keep_len - at);
            // SAFETY: `keep` is `keep_len` bytes of our own memory.
            unsafe { core::ptr::copy_nonoverlapping(buf.as_ptr(), (keep as *mut u8).add(at), m) };
        }
        sector += (n / SECTOR_SIZE) as u64;
        requests += 1;
    }
    let us = (PortIo.tsc() - start) * 1000 / tsc_khz.max(1);
    println!(
        "testguest: disk {} sectors ({} bytes), fnv1a {:#018x}, {} requests of {} bytes in {} us, read-only {}, mmio read exit {} ns",
        sectors,
        sectors * SECTOR_SIZE as u64,
        h,
        requests,
        chunk,
        us,
        blk.readonly(),
        mmio_ns
    );
    if keep != 0 {
        crate::staged::set_request_source(keep, keep_len as u64);
    }
    if write {
        // Write sector 0 back unchanged.
        if blk.read_blocks(0, &mut buf[..SECTOR_SIZE]).is_err() {
            return;
        }
        match blk.write_blocks(0, &buf[..SECTOR_SIZE]) {
            Ok(()) => println!("testguest: disk write accepted"),
            Err(e) => println!("testguest: disk write refused: {:?}", e),
        }
    }
}
