//! `--disk` and `--net`: the virtio devices' option values.

use std::path::PathBuf;
use std::str::FromStr;

use super::{key_values, on_off, VmConfigError};

/// `--disk path=FILE[,readonly=on][,direct=on][,id=NAME]`: a virtio-blk
/// disk (Cloud Hypervisor's syntax).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// Backing file or block device (its size, rounded down to 512 bytes,
    /// is the capacity).
    pub path: PathBuf,
    /// Refuse guest writes.
    pub readonly: bool,
    /// Open with `O_DIRECT`: no host page cache (each request goes through
    /// an aligned bounce buffer).
    pub direct: bool,
    /// The device's name in the report, the metrics and the guest's
    /// `GET_ID` serial (1–20 bytes of `[A-Za-z0-9_.-]`); default `blk<N>`.
    pub id: Option<String>,
}

/// Longest disk `id=` (bytes): virtio-blk's serial (VIRTIO 1.2 §5.2.6).
pub const DISK_ID_MAX: usize = 20;

impl FromStr for DiskConfig {
    type Err = VmConfigError;

    fn from_str(value: &str) -> Result<Self, VmConfigError> {
        let mut path = None;
        let (mut readonly, mut direct, mut id) = (false, false, None);
        for (key, v) in key_values(value, "path=FILE[,readonly=on][,direct=on][,id=NAME]")? {
            match key {
                "path" if !v.is_empty() => path = Some(PathBuf::from(v)),
                "readonly" => readonly = on_off("readonly", v)?,
                "direct" => direct = on_off("direct", v)?,
                "id" => {
                    let ok = !v.is_empty()
                        && v.len() <= DISK_ID_MAX
                        && v.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
                    if !ok {
                        return Err(VmConfigError::Invalid {
                            what: "disk id",
                            value: v.into(),
                            reason: format!("1 to {DISK_ID_MAX} of A-Z a-z 0-9 _ . -"),
                        });
                    }
                    id = Some(v.to_string());
                }
                _ => {
                    return Err(VmConfigError::UnknownKey {
                        key: key.into(),
                        value: value.into(),
                        expected: "path, readonly, direct, id",
                    })
                }
            }
        }
        path.map(|path| Self {
            path,
            readonly,
            direct,
            id,
        })
        .ok_or(VmConfigError::MissingKey {
            key: "path",
            value: value.into(),
        })
    }
}

/// `--net tap=NAME[,mac=MAC][,fd=N]`: a virtio-net device over a tap (Cloud
/// Hypervisor's syntax). `tap=` names the interface to open (or create);
/// `fd=` hands over a tap queue already open in this process (then `tap=`
/// is optional, only a label); `mac=` is the guest's MAC (default: a
/// random locally administered one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// The tap interface's name (≤ 15 bytes).
    pub tap: Option<String>,
    /// The MAC offered to the guest.
    pub mac: Option<[u8; 6]>,
    /// An open tap descriptor to use instead of opening `tap`.
    pub fd: Option<i32>,
}

/// Parses `aa:bb:cc:dd:ee:ff` (a unicast address, not all zeros).
fn parse_mac(v: &str) -> Result<[u8; 6], VmConfigError> {
    let bad = |reason: &str| VmConfigError::Invalid {
        what: "mac",
        value: v.into(),
        reason: reason.into(),
    };
    let mut mac = [0u8; 6];
    let mut parts = v.split(':');
    for b in mac.iter_mut() {
        let part = parts
            .next()
            .ok_or_else(|| bad("expected six hex bytes aa:bb:cc:dd:ee:ff"))?;
        if part.len() != 2 {
            return Err(bad("expected six hex bytes aa:bb:cc:dd:ee:ff"));
        }
        *b = u8::from_str_radix(part, 16)
            .map_err(|_| bad("expected six hex bytes aa:bb:cc:dd:ee:ff"))?;
    }
    if parts.next().is_some() {
        return Err(bad("expected six hex bytes aa:bb:cc:dd:ee:ff"));
    }
    if mac[0] & 1 != 0 {
        return Err(bad("a multicast address cannot be a NIC's"));
    }
    if mac == [0; 6] {
        return Err(bad("the all-zero address cannot be a NIC's"));
    }
    Ok(mac)
}

impl FromStr for NetConfig {
    type Err = VmConfigError;

    fn from_str(value: &str) -> Result<Self, VmConfigError> {
        let mut net = Self {
            tap: None,
            mac: None,
            fd: None,
        };
        for (key, v) in key_values(value, "tap=NAME[,mac=MAC][,fd=N]")? {
            match key {
                "tap" if v.is_empty() || v.len() > 15 || v.contains('/') => {
                    return Err(VmConfigError::Invalid {
                        what: "tap",
                        value: v.into(),
                        reason: "an interface name is 1 to 15 bytes without '/'".into(),
                    })
                }
                "tap" => net.tap = Some(v.into()),
                "mac" => net.mac = Some(parse_mac(v)?),
                "fd" => {
                    net.fd = Some(v.parse().ok().filter(|fd| *fd >= 0).ok_or_else(|| {
                        VmConfigError::Invalid {
                            what: "fd",
                            value: v.into(),
                            reason: "expected a descriptor number".into(),
                        }
                    })?)
                }
                _ => {
                    return Err(VmConfigError::UnknownKey {
                        key: key.into(),
                        value: value.into(),
                        expected: "tap, mac, fd",
                    })
                }
            }
        }
        if net.tap.is_none() && net.fd.is_none() {
            return Err(VmConfigError::MissingKey {
                key: "tap",
                value: value.into(),
            });
        }
        Ok(net)
    }
}
