//! Step 7 of [`super::build`]: the virtio devices (`--disk`, `--net`), each
//! in its slot ([`virtio::slot`]), with its ioeventfd and, for a Linux guest,
//! its irqfd.

use std::sync::Arc;

use kvm_ioctls::VmFd;

use super::append_word;
use crate::config::VmConfig;
use crate::devices::virtio::disk::DiskError;
use crate::devices::virtio::{self, SharedBlock};
use crate::error::{kvm_err, VmmError};

/// Step 7: opens every `--disk`, binds its queue notification to an
/// ioeventfd (else MMIO exits) and, for a Linux guest, its used-buffer
/// interrupt to GSI [`virtio::FIRST_IRQ`] + index through an irqfd. The
/// device is described in the DSDT when `acpi` (a Linux guest with ACPI
/// tables), else on `cmdline`. Returns each device with whether the
/// ioeventfd was bound.
pub(super) fn attach_disks(
    vm_fd: &VmFd,
    config: &VmConfig,
    cmdline: &mut String,
    linux_boot: bool,
    acpi: bool,
) -> Result<Vec<(SharedBlock, bool)>, VmmError> {
    let mut blocks = Vec::new();
    for (i, disk) in config.disks.iter().enumerate() {
        let path = disk.path.display().to_string();
        let disk_err = |source: DiskError| VmmError::Disk {
            path: path.clone(),
            source,
        };
        let (file, len) =
            virtio::disk::open(&disk.path, disk.readonly, disk.direct).map_err(disk_err)?;
        if len < virtio::block::SECTOR_SIZE {
            return Err(disk_err(DiskError::TooSmall(len)));
        }
        let (base, gsi) = virtio::slot(i);
        let name = disk.id.clone().unwrap_or_else(|| format!("blk{i}"));
        if config.disks[..i]
            .iter()
            .enumerate()
            .any(|(j, d)| d.id.clone().unwrap_or_else(|| format!("blk{j}")) == name)
        {
            return Err(disk_err(DiskError::DuplicateId(name)));
        }
        let mut backend = virtio::block::Block::new(file, len, disk.readonly);
        backend.set_serial(&name);
        if disk.direct {
            backend.use_direct_io();
        }
        let mut block = virtio::MmioBlock::new(name, path.clone(), base, backend)?;
        if linux_boot {
            block.set_irq(irqfd(vm_fd, gsi, "KVM_IRQFD for a virtio-blk device")?);
        }
        if !acpi {
            append_word(cmdline, &virtio::mmio::cmdline_word(base, gsi));
        }
        let ioeventfd = vm_fd
            .register_ioevent(
                &block.notify,
                &notify_address(base),
                kvm_ioctls::NoDatamatch,
            )
            .map_err(|e| tracing::info!("ioeventfd refused ({e}): notifications via MMIO exits"))
            .is_ok();
        blocks.push((Arc::new(block), ioeventfd));
    }
    Ok(blocks)
}

/// Step 7b: opens every `--net` tap and places its device after the disks
/// (slot `first` + index), bound and described as the disks are: an
/// ioeventfd with data match per queue (else MMIO exits), an irqfd for a
/// Linux guest, the DSDT or the command line. Returns each device with
/// whether its ioeventfds were bound.
pub(super) fn attach_nets(
    vm_fd: &VmFd,
    config: &VmConfig,
    cmdline: &mut String,
    linux_boot: bool,
    acpi: bool,
) -> Result<Vec<(Arc<virtio::net::MmioNet>, bool)>, VmmError> {
    let mut nets = Vec::new();
    for (i, net) in config.nets.iter().enumerate() {
        let spec = match (&net.tap, net.fd) {
            (_, Some(fd)) => format!("fd={fd}"),
            (Some(tap), None) => format!("tap={tap}"),
            (None, None) => String::new(),
        };
        let net_err = |source| VmmError::Net {
            spec: spec.clone(),
            source,
        };
        let tap = match (&net.tap, net.fd) {
            (_, Some(fd)) => virtio::net::tap::Tap::from_fd(fd),
            (Some(name), None) => virtio::net::tap::Tap::open(name),
            (None, None) => Err(virtio::net::tap::TapError::Missing),
        }
        .map_err(net_err)?;
        let (base, gsi) = virtio::slot(config.disks.len() + i);
        let mac = net.mac.unwrap_or_else(virtio::net::generate_mac);
        let mut dev = virtio::net::MmioNet::new(format!("net{i}"), base, mac, tap)?;
        if linux_boot {
            dev.set_irq(irqfd(vm_fd, gsi, "KVM_IRQFD for a virtio-net device")?);
        }
        if !acpi {
            append_word(cmdline, &virtio::mmio::cmdline_word(base, gsi));
        }
        let mut ioeventfd = true;
        for (q, fd) in dev.notify.iter().enumerate() {
            ioeventfd &= vm_fd
                .register_ioevent(fd, &notify_address(base), q as u32)
                .map_err(|e| {
                    tracing::info!("ioeventfd refused ({e}): notifications via MMIO exits")
                })
                .is_ok();
        }
        nets.push((Arc::new(dev), ioeventfd));
    }
    Ok(nets)
}

/// A Linux guest's used-buffer interrupt on GSI `gsi`: an `EventFd` bound
/// to it as an irqfd. Errors: the `EventFd` or the binding (`what` names
/// the ioctl and the device in the error).
fn irqfd(
    vm_fd: &VmFd,
    gsi: u32,
    what: &'static str,
) -> Result<vmm_sys_util::eventfd::EventFd, VmmError> {
    let irq = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK)?;
    vm_fd.register_irqfd(&irq, gsi).map_err(kvm_err(what))?;
    Ok(irq)
}

/// The `QueueNotify` register of the window at `base`, where KVM's
/// ioeventfds listen.
fn notify_address(base: u64) -> kvm_ioctls::IoEventAddress {
    kvm_ioctls::IoEventAddress::Mmio(base + virtio::mmio::reg::QUEUE_NOTIFY)
}
