//! Exports `footprint-host`'s symbols (`-rdynamic`) so the stgtrace tool's
//! stage map can name its stage entry points (bench/capture/README.md).
fn main() {
    println!("cargo:rustc-link-arg-bin=footprint-host=-rdynamic");
}
