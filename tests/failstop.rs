//! End-to-end: a panicking VMM thread ends the VM with exit status 2 and the
//! panic message (issue 14 D3: a panicking vCPU thread used to leave the VMM
//! hung with the panic lost). The debug build's `STAGEVM_TEST_PANIC` hook
//! panics the named thread kind.

mod common;

use std::time::Duration;

use common::*;
use hypercall_abi::platform::EXIT_GUEST_FAILURE;

fn panic_in(kind: &str) {
    let guest = guest_image();
    let _lock = vm_lock();
    let child = stagevm()
        .kernel(guest)
        .vcpus(2)
        .cmdline("iters=1000000000000")
        .env("STAGEVM_TEST_PANIC", kind)
        .spawn()
        .unwrap();
    let run = wait(child, Duration::from_secs(10));
    assert_eq!(run.code(), i32::from(EXIT_GUEST_FAILURE), "{run:#?}");
    assert!(
        run.stderr.contains(&format!("STAGEVM_TEST_PANIC={kind}"))
            && run.stderr.contains("ending the VM"),
        "{run:#?}"
    );
    assert!(run.elapsed < Duration::from_secs(5), "{run:#?}");
}

#[test]
fn a_panicking_vcpu_thread_ends_the_vm_with_status_2() {
    panic_in("vcpu");
}

#[test]
fn a_panicking_stage_sched_thread_ends_the_vm_with_status_2() {
    panic_in("stage-sched");
}
