//! rtnetlink link management in real namespaces: a veth whose peer moves into a guest
//! namespace, addresses and routes on both ends, traffic across, deletion.

use std::time::Duration;

use svc_control::dataplane::Links;
use svc_tests::{NetNs, require_root};

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

#[test]
fn guest_link_is_created_moved_addressed_routed_and_deleted() {
    require_root();
    let host = NetNs::new();
    let guest = NetNs::new();
    let guest_file = std::fs::File::open(format!("/run/netns/{}", guest.name)).unwrap();

    let host_ifindex = host.run(|| {
        block_on(async {
            let links = Links::connect().unwrap();
            let ifindex = links.create_veth("svc7", "svc7peer").await.unwrap();
            let peer = links
                .ifindex("svc7peer")
                .await
                .unwrap()
                .expect("peer exists");
            links.move_to_netns(peer, &guest_file).await.unwrap();
            assert_eq!(
                links.ifindex("svc7peer").await.unwrap(),
                None,
                "the peer left the host namespace"
            );
            links
                .add_address(ifindex, "10.213.60.1/30".parse().unwrap())
                .await
                .unwrap();
            links
                .add_address(ifindex, "fd53:3c::1/64".parse().unwrap())
                .await
                .unwrap();
            links.up(ifindex).await.unwrap();
            ifindex
        })
    });
    assert!(host_ifindex > 0);

    guest.run(|| {
        block_on(async {
            let links = Links::connect().unwrap();
            let peer = links
                .ifindex("svc7peer")
                .await
                .unwrap()
                .expect("the peer arrived in the guest");
            links.rename(peer, "eth0").await.unwrap();
            links
                .add_address(peer, "10.213.60.2/30".parse().unwrap())
                .await
                .unwrap();
            links.up(peer).await.unwrap();
            let lo = links.ifindex("lo").await.unwrap().unwrap();
            links.up(lo).await.unwrap();
            links
                .add_route(
                    "0.0.0.0/0".parse().unwrap(),
                    Some("10.213.60.1".parse().unwrap()),
                    peer,
                )
                .await
                .unwrap();
            assert!(
                links
                    .add_route(
                        "0.0.0.0/0".parse().unwrap(),
                        Some("fd53:3c::1".parse().unwrap()),
                        peer
                    )
                    .await
                    .is_err(),
                "mixed families are refused"
            );
        })
    });
    let routes = String::from_utf8_lossy(&guest.exec("ip", &["route"]).stdout).into_owned();
    assert!(
        routes.contains("default via 10.213.60.1 dev eth0"),
        "{routes}"
    );
    let mut reached = false;
    for _ in 0..20 {
        if guest
            .exec("ping", &["-c", "1", "-W", "1", "10.213.60.1"])
            .status
            .success()
        {
            reached = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(reached, "the guest reaches the host end over the new link");

    host.run(|| {
        block_on(async {
            Links::connect()
                .unwrap()
                .delete(host_ifindex)
                .await
                .unwrap()
        })
    });
    let left = String::from_utf8_lossy(&guest.exec("ip", &["-o", "link"]).stdout).into_owned();
    assert!(
        !left.contains("eth0"),
        "deleting the host end removes the guest end: {left}"
    );
    let missing =
        host.run(|| block_on(async { Links::connect().unwrap().ifindex("svc7").await.unwrap() }));
    assert_eq!(missing, None);
}

#[test]
fn netlink_errors_name_the_operation() {
    require_root();
    let ns = NetNs::new();
    let err =
        ns.run(|| block_on(async { Links::connect().unwrap().up(999_999).await.unwrap_err() }));
    assert!(err.to_string().contains("bringing link 999999 up"), "{err}");
    let err = ns.run(|| {
        block_on(async {
            let l = Links::connect().unwrap();
            l.create_veth("dup0", "dup1").await.unwrap();
            l.create_veth("dup0", "dup2").await.unwrap_err()
        })
    });
    assert!(err.to_string().contains("creating veth dup0"), "{err}");
}

#[test]
fn mark_rules_are_added_and_listed() {
    require_root();
    let ns = NetNs::new();
    let rules = ns.run(|| {
        block_on(async {
            let l = Links::connect().unwrap();
            l.add_mark_rule(0x5c5c_0002, 100, 1000, false)
                .await
                .unwrap();
            l.add_mark_rule(0x5c5c_0002, 100, 1000, true).await.unwrap();
            (
                l.mark_rules(false).await.unwrap(),
                l.mark_rules(true).await.unwrap(),
            )
        })
    });
    assert!(rules.0.contains(&(0x5c5c_0002, 100)), "{rules:?}");
    assert!(rules.1.contains(&(0x5c5c_0002, 100)), "{rules:?}");
    let shown = String::from_utf8_lossy(&ns.exec("ip", &["rule"]).stdout).into_owned();
    assert!(shown.contains("fwmark 0x5c5c0002 lookup 100"), "{shown}");
}
