//! Builds libstage (guest-agent/linux/libstage: the Linux guest agent's
//! user-space reporting, C) into the library: in a stagevm guest the stage
//! points report through it (`channel`). The same sources and flags as its
//! Makefile; `cc` adds `-fPIC` for the shared object.

fn main() {
    let libstage = "../linux/libstage";
    let sources = ["stage.c", "hot.c", "request.c"];
    let mut build = cc::Build::new();
    build
        .std("gnu11")
        .flag("-pthread")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .include(libstage)
        .include("../linux/include")
        .include("../../hypercall-abi/include");
    for s in sources {
        build.file(format!("{libstage}/{s}"));
    }
    build.compile("stage");
    for f in [
        "stage.c",
        "hot.c",
        "request.c",
        "stage.h",
        "internal.h",
        "request.h",
        "rseq_cs.h",
    ] {
        println!("cargo:rerun-if-changed={libstage}/{f}");
    }
    for f in ["../linux/include", "../../hypercall-abi/include"] {
        println!("cargo:rerun-if-changed={f}");
    }
}
