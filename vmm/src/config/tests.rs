//! Tests of the command-line value parsers.

#[test]
fn stage_trace_values() {
    assert_eq!("off".parse(), Ok(TraceConfig { every: 0 }));
    assert_eq!("on".parse(), Ok(TraceConfig { every: 1 }));
    assert_eq!("every=64".parse(), Ok(TraceConfig { every: 64 }));
    for bad in ["every=0", "every=x", "yes", "rate=5"] {
        let e = bad.parse::<TraceConfig>().unwrap_err().to_string();
        assert!(e.contains(bad), "{e}");
    }
}

use super::*;

#[test]
fn sizes_parse_with_suffixes() {
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert_eq!(parse_size("512K").unwrap(), 512 << 10);
    assert_eq!(parse_size("256M").unwrap(), 256 << 20);
    assert_eq!(parse_size("1g").unwrap(), 1 << 30);
    assert!(parse_size("abc").is_err());
    assert!(parse_size("").is_err());
    assert!(parse_size("99999999999999G").is_err());
    for text in ["4095", "512K", "256M", "3G", "1536K"] {
        assert_eq!(format_size(parse_size(text).unwrap()), text);
    }
}

#[test]
fn cpus_reject_zero_and_garbage() {
    assert_eq!("boot=4".parse::<CpusConfig>().unwrap().boot, 4);
    let e = "boot=0".parse::<CpusConfig>().unwrap_err().to_string();
    assert!(e.contains("'0'"), "{e}");
    let e = "boot=x".parse::<CpusConfig>().unwrap_err().to_string();
    assert!(e.contains("'x'"), "{e}");
    let e = "max=2".parse::<CpusConfig>().unwrap_err().to_string();
    assert!(e.contains("'max'"), "{e}");
    assert!("".parse::<CpusConfig>().is_err());
}

#[test]
fn memory_bounds() {
    assert_eq!("size=256M".parse::<MemoryConfig>().unwrap().size, 256 << 20);
    let big = "size=8G,hugepages=on".parse::<MemoryConfig>().unwrap();
    assert_eq!((big.size, big.hugepages), (8 << 30, true));
    assert!("size=257G".parse::<MemoryConfig>().is_err());
    assert!("size=3M,hugepages=on".parse::<MemoryConfig>().is_err());
    assert!("size=4G,hugepages=yes".parse::<MemoryConfig>().is_err());
    assert!("size=1000".parse::<MemoryConfig>().is_err());
    assert!("size=0".parse::<MemoryConfig>().is_err());
}

#[test]
fn net_forms() {
    let n: NetConfig = "tap=tap0,mac=52:54:00:12:34:56".parse().unwrap();
    assert_eq!(n.tap.as_deref(), Some("tap0"));
    assert_eq!(n.mac, Some([0x52, 0x54, 0, 0x12, 0x34, 0x56]));
    assert_eq!("fd=3".parse::<NetConfig>().unwrap().fd, Some(3));
    for (bad, needle) in [
        ("mac=52:54:00:12:34:56", "tap"),
        ("tap=tap0,mac=01:00:00:00:00:01", "01:00:00:00:00:01"),
        ("tap=tap0,mac=52:54:00:12:34", "52:54:00:12:34"),
        ("tap=tap0,mac=zz:54:00:12:34:56", "zz:54"),
        (
            "tap=a-very-long-interface-name",
            "a-very-long-interface-name",
        ),
        ("tap=tap0,fd=-1", "-1"),
        ("tap=tap0,queues=2", "queues"),
    ] {
        let e = bad.parse::<NetConfig>().unwrap_err().to_string();
        assert!(e.contains(needle), "{bad}: {e}");
    }
}

#[test]
fn disk_forms() {
    let d: DiskConfig = "path=/tmp/d.img,readonly=on".parse().unwrap();
    assert_eq!((d.path.to_str().unwrap(), d.readonly), ("/tmp/d.img", true));
    assert!(!"path=x".parse::<DiskConfig>().unwrap().readonly);
    assert!("readonly=on".parse::<DiskConfig>().is_err());
    assert!("path=x,readonly=maybe"
        .parse::<DiskConfig>()
        .unwrap_err()
        .to_string()
        .contains("'maybe'"));
}

#[test]
fn boot_modes() {
    for mode in [
        BootMode::Auto,
        BootMode::Unikernel,
        BootMode::Pvh,
        BootMode::BzImage,
    ] {
        assert_eq!(mode.name().parse::<BootMode>().unwrap(), mode);
    }
    let e = "efi".parse::<BootMode>().unwrap_err().to_string();
    assert!(e.contains("'efi'"), "{e}");
}

#[test]
fn serial_forms() {
    assert_eq!("tty".parse::<SerialConfig>().unwrap(), SerialConfig::Tty);
    assert_eq!("null".parse::<SerialConfig>().unwrap(), SerialConfig::Null);
    assert_eq!(
        "file=/tmp/x".parse::<SerialConfig>().unwrap(),
        SerialConfig::File("/tmp/x".into())
    );
    assert_eq!("pty".parse::<SerialConfig>().unwrap(), SerialConfig::Pty);
    assert_eq!(
        "socket=/tmp/c.sock".parse::<SerialConfig>().unwrap(),
        SerialConfig::Socket("/tmp/c.sock".into())
    );
    for bad in ["socket=", "file=", "serial", "pts"] {
        let e = bad.parse::<SerialConfig>().unwrap_err().to_string();
        assert!(e.contains(bad), "{e}");
    }
}
