//! Target 3: the doorbell decoder.
//!
//! Arbitrary sequences of doorbell `out`s and `in`s (any vCPU index, any
//! port, 0 to 8 data bytes) interleaved with the `stage-sched` thread's
//! calls (drain, publish, the parked-vCPU safety net, stop) on one device,
//! checked against a model of docs/stage-protocol.md §6: the status each
//! command leaves for its vCPU, short `out`s zero-extended, `in`s writing
//! at most 4 bytes, and the WAIT / WAKE / registration counters.
//!
//! WAIT cannot hang the target: every WAIT of an existing vCPU is preceded
//! by a WAKE of that vCPU (the token makes the WAIT return at once,
//! whatever its timeout), or the device was stopped. The harness's
//! slowest-case time would show a WAIT that blocked anyway.

use std::time::{Duration, Instant};

use hypercall_abi::stage::{
    Layout, Status, DOORBELL_REGISTER, DOORBELL_STATUS, DOORBELL_UNREGISTER, DOORBELL_WAIT,
    DOORBELL_WAKE, MAX_STAGES, RINGS_OFFSET,
};
use stage_device::abi::Obj;
use stage_device::stage::StageDevice;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::guest::{memory as guest_memory, ZeroOnDrop};
use crate::input::Input;
use crate::stage_register::AREA;

/// Guest RAM of the target's VMs (bytes).
pub const MEM: u64 = 2 << 20;
const PORTS: [u16; 6] = [
    DOORBELL_REGISTER,
    DOORBELL_UNREGISTER,
    DOORBELL_WAIT,
    DOORBELL_WAKE,
    0x611,
    0x61f,
];

thread_local! {
    static MEMORY: GuestMemoryMmap = guest_memory(MEM);
}

/// The target (see the module documentation).
pub fn fuzz(data: &[u8]) {
    MEMORY.with(|mem| run(mem, data));
}

fn value_of(data: &[u8]) -> u32 {
    let mut raw = [0u8; 4];
    let n = data.len().min(4);
    raw[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(raw)
}

fn run(mem: &GuestMemoryMmap, data: &[u8]) {
    let _clean = ZeroOnDrop::new(mem, MEM, AREA, RINGS_OFFSET);
    let mut inp = Input::new(data);
    let n = inp.range(1, 4);
    // The area at AREA is valid unless the input breaks its magic.
    let valid_area = !inp.one_in(4);
    let layout = Layout::new(n, inp.range(1, 16), 8).unwrap();
    let mut header = layout.header();
    if !valid_area {
        header.magic ^= 1;
    }
    mem.write_obj(Obj(header), GuestAddress(AREA)).unwrap();
    let dev = StageDevice::new(std::sync::Arc::new(mem.clone()), MEM, n, 0, 1000);

    let mut status = vec![Status::Ok as u32; n as usize];
    let (mut registered, mut registrations, mut rejected) = (false, 0u64, 0u64);
    let (mut waits, mut wakes, mut host_wakes) = (0u64, 0u64, 0u64);
    let mut stopped = false;
    let ops = inp.range(1, 48);
    for _ in 0..ops {
        let vcpu = match inp.u8() % 8 {
            0 => inp.u32(),
            1 => n + u32::from(inp.u8() % 2),
            _ => inp.below(n),
        };
        match inp.u8() % 16 {
            0..=8 => {
                let port = if inp.one_in(8) {
                    inp.u16()
                } else {
                    inp.pick(&PORTS)
                };
                let len = inp.below(9) as usize;
                let mut bytes = inp.bytes(len);
                if port == DOORBELL_REGISTER && inp.bool() {
                    bytes = ((AREA >> 12) as u32).to_le_bytes()[..len.min(4)].to_vec();
                    bytes.resize(len, 0);
                }
                let value = value_of(&bytes);
                if port == DOORBELL_WAIT && vcpu < n && !stopped {
                    // The token that keeps this WAIT from blocking.
                    dev.doorbell(vcpu, DOORBELL_WAKE, &vcpu.to_le_bytes());
                    wakes += 1;
                }
                let t = Instant::now();
                let r = dev.doorbell(vcpu, port, &bytes);
                let took = t.elapsed();
                let want = match port {
                    DOORBELL_REGISTER => {
                        let ok = valid_area && value == (AREA >> 12) as u32;
                        let s = match (ok, registered) {
                            (true, false) => Status::Ok,
                            (true, true) => Status::AlreadyRegistered,
                            _ => Status::BadMagic, // any refusal; checked below
                        };
                        if s == Status::Ok {
                            registered = true;
                            registrations += 1;
                        } else {
                            rejected += 1;
                        }
                        Some(s)
                    }
                    DOORBELL_UNREGISTER => Some(if std::mem::take(&mut registered) {
                        Status::Ok
                    } else {
                        Status::NotRegistered
                    }),
                    DOORBELL_WAIT if vcpu < n => {
                        waits += 1;
                        Some(Status::Ok)
                    }
                    DOORBELL_WAKE if value < n => {
                        wakes += 1;
                        Some(Status::Ok)
                    }
                    DOORBELL_WAIT | DOORBELL_WAKE => Some(Status::BadVcpu),
                    _ => None,
                };
                assert_eq!(
                    r.is_some(),
                    want == Some(Status::Ok) && port == DOORBELL_REGISTER
                );
                assert!(
                    took < Duration::from_millis(50),
                    "doorbell {port:#x} value {value} took {took:?}"
                );
                if let (Some(s), Some(slot)) = (want, status.get_mut(vcpu as usize)) {
                    *slot = if port == DOORBELL_REGISTER && s == Status::BadMagic {
                        // A refused REGISTER: whichever refusal, never Ok.
                        let mut st = [0u8; 4];
                        dev.read_status(vcpu, DOORBELL_STATUS, &mut st);
                        let got = u32::from_le_bytes(st);
                        assert!(
                            got != Status::Ok as u32 && Status::from_u32(got).is_some(),
                            "refused REGISTER {value:#x} left status {got}"
                        );
                        got
                    } else {
                        s as u32
                    };
                }
            }
            9..=10 => {
                let port = if inp.bool() {
                    DOORBELL_STATUS
                } else {
                    inp.u16()
                };
                let len = inp.below(9) as usize;
                let fill = inp.u8();
                let mut buf = vec![fill; len];
                dev.read_status(vcpu, port, &mut buf);
                let mut want = vec![fill; len];
                if port == DOORBELL_STATUS {
                    let s = status
                        .get(vcpu as usize)
                        .copied()
                        .unwrap_or(Status::BadVcpu as u32);
                    let k = len.min(4);
                    want[..k].copy_from_slice(&s.to_le_bytes()[..k]);
                }
                assert_eq!(buf, want, "in from port {port:#x}, vcpu {vcpu}");
            }
            11 => assert!(dev.drain().events.is_empty(), "empty rings drained events"),
            12 => {
                let masks: Vec<u64> = (0..inp.below(MAX_STAGES as u32 + 3))
                    .map(|_| inp.u64())
                    .collect();
                dev.publish(
                    &masks,
                    inp.u64(),
                    hypercall_abi::stage::VisitPolicy::from_code(inp.below(7) as u64)
                        .unwrap_or_default(),
                );
            }
            13 => {
                // Guest-written parking hints, then the host's safety net.
                let v = inp.below(n);
                let (depth, parked) = (inp.u32_near(0), inp.u32_near(0));
                if registered {
                    let base = AREA + Layout::vcpu_state_offset(v);
                    mem.write_obj(depth, GuestAddress(base)).unwrap();
                    mem.write_obj(parked, GuestAddress(base + 4)).unwrap();
                }
                dev.wake_parked_with_work();
                if registered {
                    for u in 0..n {
                        let base = AREA + Layout::vcpu_state_offset(u);
                        let d: u32 = mem.read_obj(GuestAddress(base)).unwrap();
                        let p: u32 = mem.read_obj(GuestAddress(base + 4)).unwrap();
                        host_wakes += u64::from(d != 0 && p != 0);
                    }
                }
            }
            14 if inp.one_in(4) => {
                dev.stop();
                stopped = true;
            }
            _ => {}
        }
    }
    let r = dev.report();
    assert_eq!(r.registered, registered);
    assert_eq!(r.registrations, registrations);
    assert_eq!(r.registrations_rejected.values().sum::<u64>(), rejected);
    assert_eq!((r.waits, r.wakes, r.host_wakes), (waits, wakes, host_wakes));
}
