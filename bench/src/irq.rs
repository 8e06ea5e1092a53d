//! `irq-probe`: what delivering one interrupt to a ring-3 guest costs on this
//! KVM, next to an MMIO exit — the figures behind the virtio-blk design
//! choice (polling with interrupts off, see `vmm/src/devices/virtio/mod.rs`).
//!
//! A minimal raw-KVM guest (no stagevm code, like the project's KVM probes (`docs/design.md`)): an
//! in-kernel irqchip, a 64-bit IDT with a ring-0 handler that increments a
//! counter, writes the local APIC's EOI register and returns with `iretq`, a
//! TSS whose RSP0 is the handler's stack, and a ring-3 loop with interrupts
//! on that spins until the counter reaches N. The host sends N MSIs
//! (`KVM_SIGNAL_MSI`), each after the previous one was handled, and reports
//! the mean time from sending one to seeing its handler's increment. Then the
//! same guest loop is timed doing MMIO reads (exits to user space).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use kvm_bindings::{kvm_msi, kvm_regs, kvm_segment, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuExit};

/// Measures interrupt delivery into a ring-3 guest.
#[derive(Parser, Debug)]
#[command(name = "irq-probe", about)]
struct Args {
    /// Interrupts to send.
    #[arg(long, default_value_t = 2000)]
    count: u64,
}

const MEM: usize = 4 << 20;
const PML4: u64 = 0x1_0000;
const GDT: u64 = 0x500;
const TSS: u64 = 0x3000;
const IDT: u64 = 0x4000;
const HANDLER: u64 = 0x6000;
const KSTACK: u64 = 0x7ff0;
const COUNTER: u64 = 0x8000;
const CODE: u64 = 0x20_0000;
const USTACK: u64 = 0x30_0000;
/// Vector whose handler ends the run (`out DONE_PORT`).
const STOP_VECTOR: u64 = 0x41;
const VECTOR: u64 = 0x40;
const APIC: u64 = 0xfee0_0000;
const MMIO: u64 = 0xd000_0000;
/// Port the guest writes when done.
const DONE_PORT: u16 = 0x99;

fn w64(mem: &mut [u8], at: u64, v: u64) {
    mem[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
}

fn seg(selector: u16, code: bool, dpl: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 11 } else { 3 },
        present: 1,
        dpl,
        db: u8::from(!code),
        s: 1,
        l: u8::from(code),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Guest code: `mode` 0 = spin (`jmp $`) until the stop interrupt; 1 = `n`
/// MMIO reads, then `out DONE_PORT, al`.
fn guest_code(mode: u8, n: u64) -> Vec<u8> {
    let mut c = Vec::new();
    if mode == 0 {
        c.extend_from_slice(&[0xeb, 0xfe]); // jmp $
    } else {
        c.extend_from_slice(&[0x48, 0xb9]); // mov rcx, imm64
        c.extend_from_slice(&n.to_le_bytes());
        c.extend_from_slice(&[0x48, 0xbe]); // mov rsi, imm64
        c.extend_from_slice(&MMIO.to_le_bytes());
        let top = c.len();
        c.extend_from_slice(&[0x8b, 0x06]); // mov eax, [rsi]
        c.extend_from_slice(&[0x48, 0xff, 0xc9]); // dec rcx
        let rel = top as i64 - (c.len() as i64 + 2);
        c.extend_from_slice(&[0x75, rel as u8]); // jnz top
    }
    c.extend_from_slice(&[0xe6, DONE_PORT as u8]); // out DONE_PORT, al
    c
}

/// Runs the probe guest and prints one table row per mechanism (means).
fn probe(count: u64) -> Result<()> {
    let kvm = Kvm::new().context("opening /dev/kvm")?;
    let vm = kvm.create_vm()?;
    vm.create_irq_chip().context("KVM_CREATE_IRQCHIP")?;
    // SAFETY: anonymous private mapping, owned until the VM is gone.
    let host = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MEM,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if host == libc::MAP_FAILED {
        bail!("mmap failed");
    }
    // SAFETY: MEM bytes just mapped, used only through this slice and by KVM.
    let mem = unsafe { std::slice::from_raw_parts_mut(host as *mut u8, MEM) };
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: MEM as u64,
        userspace_addr: host as u64,
        flags: 0,
    };
    // SAFETY: the region stays mapped for the VM's lifetime (leaked on return).
    unsafe { vm.set_user_memory_region(region)? };

    // Page tables: RAM (2 MiB pages, user), the MMIO page (user) and the
    // local APIC page (kernel only).
    w64(mem, PML4, (PML4 + 0x1000) | 7);
    w64(mem, PML4 + 0x1000, (PML4 + 0x2000) | 7); // PDPT[0] -> PD0 (GiB 0)
    w64(mem, PML4 + 0x1000 + 8 * 3, (PML4 + 0x3000) | 7); // PDPT[3] -> PD3
                                                          // The first 2 MiB (descriptor tables, handler, kernel stack, counter)
                                                          // are supervisor-only, so SMEP/SMAP never matter; the user code and
                                                          // stack live in the second 2 MiB.
    w64(mem, PML4 + 0x2000, 0x83);
    w64(mem, PML4 + 0x2000 + 8, 0x20_0000 | 0x87);
    w64(mem, PML4 + 0x3000 + 8 * ((MMIO >> 21) & 511), MMIO | 0x87);
    w64(mem, PML4 + 0x3000 + 8 * ((APIC >> 21) & 511), APIC | 0x83);
    // GDT: null, kernel code/data, user code/data, 64-bit TSS (2 slots).
    let gdt = [
        0u64,
        0x00af_9b00_0000_ffff,
        0x00cf_9300_0000_ffff,
        0x00af_fb00_0000_ffff,
        0x00cf_f300_0000_ffff,
    ];
    for (i, e) in gdt.iter().enumerate() {
        w64(mem, GDT + 8 * i as u64, *e);
    }
    let tss_lo = 0x67 | ((TSS & 0xff_ffff) << 16) | (0x89 << 40) | ((TSS >> 24 & 0xff) << 56);
    w64(mem, GDT + 40, tss_lo);
    w64(mem, GDT + 48, TSS >> 32);
    w64(mem, TSS + 4, KSTACK); // RSP0
                               // IDT entries: interrupt gates, selector 0x08, DPL 0.
    let stop_handler = HANDLER + 0x100;
    for (vector, handler) in [(VECTOR, HANDLER), (STOP_VECTOR, stop_handler)] {
        let gate = IDT + 16 * vector;
        let lo =
            (handler & 0xffff) | (0x08 << 16) | (0x8e00 << 32) | ((handler >> 16 & 0xffff) << 48);
        w64(mem, gate, lo);
        w64(mem, gate + 8, handler >> 32);
    }
    // Stop handler: out DONE_PORT, al.
    mem[stop_handler as usize..stop_handler as usize + 2].copy_from_slice(&[0xe6, DONE_PORT as u8]);
    // Handler: inc qword [COUNTER]; mov dword [APIC+0xb0], 0 (EOI); iretq.
    let mut h = vec![0x48, 0xff, 0x04, 0x25];
    h.extend_from_slice(&(COUNTER as u32).to_le_bytes());
    h.extend_from_slice(&[0x48, 0xb8]);
    h.extend_from_slice(&(APIC + 0xb0).to_le_bytes()); // mov rax, APIC+0xb0
    h.extend_from_slice(&[0xc7, 0x00, 0, 0, 0, 0]); // mov dword [rax], 0
    h.extend_from_slice(&[0x48, 0xcf]); // iretq
    mem[HANDLER as usize..HANDLER as usize + h.len()].copy_from_slice(&h);

    let mut vcpu = vm.create_vcpu(0)?;
    // Software-enable the local APIC (spurious-interrupt vector register bit 8).
    let mut lapic = vcpu.get_lapic()?;
    let svr = 0xf0;
    let v = u32::from_le_bytes([0, 1, 2, 3].map(|i| lapic.regs[svr + i] as u8)) | 0x1ff;
    for (i, b) in v.to_le_bytes().iter().enumerate() {
        lapic.regs[svr + i] = *b as _;
    }
    vcpu.set_lapic(&lapic)?;
    let mut sregs = vcpu.get_sregs()?;
    sregs.cs = seg(0x1b, true, 3);
    let data = seg(0x23, false, 3);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.gdt.base = GDT;
    sregs.gdt.limit = 8 * 7 - 1;
    sregs.idt.base = IDT;
    sregs.idt.limit = (16 * (STOP_VECTOR + 1) - 1) as u16;
    sregs.tr = kvm_segment {
        base: TSS,
        limit: 0x67,
        selector: 0x28,
        type_: 11,
        present: 1,
        ..Default::default()
    };
    sregs.cr0 = 0x8005_0033;
    sregs.cr3 = PML4;
    sregs.cr4 = 0x20;
    sregs.efer = 0x500;
    vcpu.set_sregs(&sregs)?;

    let run = |vcpu: &mut kvm_ioctls::VcpuFd,
               mem: &mut [u8],
               mode: u8,
               n: u64|
     -> Result<Duration> {
        let code = guest_code(mode, n);
        mem[CODE as usize..CODE as usize + code.len()].copy_from_slice(&code);
        w64(mem, COUNTER, 0);
        vcpu.set_regs(&kvm_regs {
            rip: CODE,
            rsp: USTACK,
            rflags: 0x3202, // IOPL 3, IF
            ..Default::default()
        })?;
        let t0 = Instant::now();
        loop {
            match vcpu.run()? {
                VcpuExit::IoOut(DONE_PORT, _) => return Ok(t0.elapsed()),
                VcpuExit::MmioRead(_, data) => data.fill(0),
                VcpuExit::MmioWrite(..) => {}
                other => {
                    let what = format!("{other:?}");
                    let regs = vcpu.get_regs()?;
                    let sregs = vcpu.get_sregs()?;
                    bail!(
                        "unexpected exit {what} at RIP {:#x} RSP {:#x} CS {:#x} CR2 {:#x} CR4 {:#x}",
                        regs.rip,
                        regs.rsp,
                        sregs.cs.selector,
                        sregs.cr2,
                        sregs.cr4
                    )
                }
            }
        }
    };

    // Interrupts: the vCPU runs on its own thread; this thread sends MSIs.
    let counter_addr = host as usize + COUNTER as usize;
    let done = Arc::new(AtomicBool::new(false));
    let mut per_irq = Duration::ZERO;
    std::thread::scope(|s| -> Result<()> {
        let d = done.clone();
        let mem_ptr = host as usize;
        let handle = s.spawn(move || {
            // SAFETY: the same mapping as `mem`; this thread alone writes it now.
            let mem = unsafe { std::slice::from_raw_parts_mut(mem_ptr as *mut u8, MEM) };
            let r = run(&mut vcpu, mem, 0, count);
            d.store(true, Ordering::Release);
            r.map(|_| vcpu)
        });
        // Let the guest reach its loop.
        std::thread::sleep(Duration::from_millis(50));
        let msi = kvm_msi {
            address_lo: APIC as u32,
            data: VECTOR as u32,
            ..Default::default()
        };
        for i in 0..count {
            let t0 = Instant::now();
            vm.signal_msi(msi)?;
            // SAFETY: an aligned u64 in guest memory the guest increments.
            while unsafe { std::ptr::read_volatile(counter_addr as *const u64) } <= i {
                if done.load(Ordering::Acquire) {
                    let outcome = handle
                        .join()
                        .map_err(|_| anyhow::anyhow!("vCPU thread panicked"))?;
                    bail!(
                        "the guest ended before interrupt {i} was handled: {:?}",
                        outcome.err()
                    );
                }
                if t0.elapsed() > Duration::from_secs(2) {
                    bail!("interrupt {i} was not handled within 2 s");
                }
                std::hint::spin_loop();
            }
            per_irq += t0.elapsed();
        }
        vm.signal_msi(kvm_msi {
            address_lo: APIC as u32,
            data: STOP_VECTOR as u32,
            ..Default::default()
        })?;
        let mut vcpu = handle
            .join()
            .map_err(|_| anyhow::anyhow!("vCPU thread panicked"))??;
        // MMIO reads, the same guest, on this thread.
        // SAFETY: the vCPU thread has ended; this thread alone uses the mapping.
        let mem = unsafe { std::slice::from_raw_parts_mut(mem_ptr as *mut u8, MEM) };
        let mmio = run(&mut vcpu, mem, 1, count)?;
        println!(
            "| interrupt (MSI → ring-0 handler, EOI, iretq → ring 3) | {:.1} µs |",
            per_irq.as_secs_f64() * 1e6 / count as f64
        );
        println!(
            "| MMIO read exit from ring 3 | {:.1} µs |",
            mmio.as_secs_f64() * 1e6 / count as f64
        );
        Ok(())
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.count == 0 {
        bail!("--count 0: send at least one interrupt");
    }
    println!(
        "interrupt delivery vs MMIO exit into a ring-3 guest on this KVM ({} samples, means)",
        args.count
    );
    println!("| mechanism | cost |");
    println!("|---|---:|");
    probe(args.count)?;
    Ok(())
}
