//! The namespace helpers on this machine (they need root: without the
//! right to make a namespace a test says so and passes).

use std::io::{Read, Write};
use std::time::Duration;

use super::*;

/// A namespace, or `None` (printed) where none can be made.
fn netns() -> Option<Netns> {
    match Netns::new() {
        Ok(ns) => Some(ns),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

#[test]
fn tcp_echoes_over_the_namespace_loopback() {
    let Some(ns) = netns() else { return };
    let listener = ns.tcp_listen("127.0.0.1:7".parse().unwrap()).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut data = Vec::new();
        s.read_to_end(&mut data).unwrap();
        s.write_all(&data).unwrap();
    });
    let data: Vec<u8> = (0..12 << 10).map(|i| (i * 7) as u8).collect();
    let back = ns
        .tcp_echo(
            "127.0.0.1:7".parse().unwrap(),
            &data,
            Duration::from_secs(10),
        )
        .unwrap();
    server.join().unwrap();
    assert_eq!(back, data);
    // The host's namespace has no such listener.
    assert!(std::net::TcpStream::connect("127.0.0.1:7").is_err());
}

#[test]
fn a_panic_in_the_namespace_reaches_the_caller_and_the_namespace_lives_on() {
    let Some(ns) = netns() else { return };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        ns.run(|| panic!("inside")).unwrap();
    }));
    assert!(r.is_err());
    assert_eq!(ns.run(|| 7).unwrap(), 7);
}

#[test]
fn packets_cross_a_veth_pair_between_two_namespaces() {
    let (Some(a), Some(b)) = (netns(), netns()) else {
        return;
    };
    if let Err(e) = a.ip(&[
        "link", "add", "kitveth0", "type", "veth", "peer", "name", "kitveth1",
    ]) {
        return eprintln!("skipped: {e}");
    }
    a.ip(&["link", "set", "kitveth1", "netns", &b.tid().to_string()])
        .unwrap();
    a.run(|| set_up("kitveth0")).unwrap().unwrap();
    b.run(|| set_up("kitveth1")).unwrap().unwrap();
    let counter = b
        .spawn(|| {
            let p = Packet::open("kitveth1", Duration::from_millis(100)).unwrap();
            p.set_recv_buffer(1 << 20).unwrap();
            p.count(
                Some(PEER_MAC),
                Duration::from_secs(5),
                Duration::from_secs(1),
            )
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    a.run(|| {
        let p = Packet::open("kitveth0", Duration::from_millis(100)).unwrap();
        p.bypass_qdisc().unwrap();
        for _ in 0..10 {
            assert!(p.send(&frame(GUEST_MAC, PEER_MAC, 100)).unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
        p.send(&stop_frame(GUEST_MAC, PEER_MAC)).unwrap();
    })
    .unwrap();
    let c = counter.join().unwrap();
    assert!(c.stopped, "{c:?}");
    assert_eq!((c.frames, c.bytes), (10, 1000), "{c:?}");
}

#[test]
fn a_tap_is_made_up_with_its_mtu_set() {
    let ns = match Netns::with_tap("kittap0") {
        Ok(ns) => ns,
        Err(e) => return eprintln!("skipped: {e}"),
    };
    ns.run(|| set_mtu("kittap0", 9000)).unwrap().unwrap();
    let link = ns
        .run(|| {
            let out = std::process::Command::new("ip")
                .args(["-o", "link", "show", "kittap0"])
                .output()
                .expect("ip (iproute2)");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .unwrap();
    assert!(link.contains("mtu 9000") && link.contains(",UP"), "{link}");
    assert!(matches!(set_up(""), Err(NetError::BadName(_))));
    assert_eq!(mac_text(&GUEST_MAC), "52:54:00:5e:00:01");
}
