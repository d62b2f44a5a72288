//! The nftables table of the fence (`inet svc` by default), built as libnftables JSON, checked
//! against the `nftables` crate's schema and applied with `nft -j -f -`, one batch per change.
//!
//! ```text
//! table inet svc {
//!   set links  { type ifname }                    # the host ends of guest links
//!   set never4/never6 { interval }                # sandbox pools and host addresses
//!   set allow4/allow6 { interval }                # operator exceptions (network.allow_cidrs)
//!   set deny4/deny6   { interval }                # refused destination classes
//!   chain prerouting  nat  dstnat: marked DNS → :guard (udp, tcp); marked web → :proxy
//!   chain input       filter: from links only the guard, the proxy and neighbour discovery
//!   chain forward     filter: from links, marked DNS/web never forwarded, never/deny sets
//!                     dropped, operator exceptions accepted; to links only established
//!   chain postrouting nat  srcnat: from links out of the host: masquerade
//! }
//! ```
//!
//! The eBPF fence is the first layer and decides per address; this table is the second,
//! generated from the same policy (the destination classes), and it is what sends DNS to the
//! guard and web traffic to the proxy.

use ipnet::IpNet;
use serde_json::{Value, json};
use svc_ebpf_common::mark;

use super::error::DataplaneError;

/// Settings of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftConfig {
    /// Table name (tests use their own).
    pub table: String,
    /// Port of the DNS guard on the host end's addresses.
    pub guard_port: u16,
    /// Port of the HTTPS proxy.
    pub proxy_port: u16,
    /// Sandbox pools and host addresses: never reachable.
    pub never: Vec<IpNet>,
    /// Refused destination classes.
    pub deny: Vec<IpNet>,
    /// The operator's exceptions to `deny`.
    pub operator_allow: Vec<IpNet>,
}

/// The fence's nftables table.
#[derive(Debug, Clone)]
pub struct Nft {
    config: NftConfig,
}

impl Nft {
    pub fn new(config: NftConfig) -> Self {
        Self { config }
    }

    pub fn table(&self) -> &str {
        &self.config.table
    }

    /// Create (or replace, atomically) the whole table with `links` in its link set.
    pub fn apply(&self, links: &[String]) -> Result<(), DataplaneError> {
        let mut batch = Vec::new();
        let t = self.table_obj();
        // add + delete + add: a fresh table in one transaction whether or not one existed.
        batch.push(json!({ "add": { "table": t } }));
        batch.push(json!({ "delete": { "table": t } }));
        batch.push(json!({ "add": { "table": t } }));
        batch.extend(self.sets(links));
        batch.extend(self.chains());
        batch.extend(self.rules());
        self.run(batch)
    }

    /// Replace the link set (one batch).
    pub fn set_links(&self, links: &[String]) -> Result<(), DataplaneError> {
        let mut batch =
            vec![json!({ "flush": { "set": self.set_obj("links", "ifname", false, None) } })];
        if !links.is_empty() {
            batch.push(json!({ "add": { "element": { "family": "inet", "table": self.config.table, "name": "links", "elem": links } } }));
        }
        self.run(batch)
    }

    /// Add one link to, or take one from, the link set: one element, whatever the set's size
    /// (a sandbox's creation and destruction; [`Self::set_links`] rewrites the whole set).
    pub fn change_link(&self, link: &str, add: bool) -> Result<(), DataplaneError> {
        let op = if add { "add" } else { "delete" };
        self.run(vec![json!({ op: { "element": {
            "family": "inet", "table": self.config.table, "name": "links", "elem": [link]
        } } })])
    }

    /// The links in the link set, as the kernel has them.
    pub fn links(&self) -> Result<Vec<String>, DataplaneError> {
        let out = std::process::Command::new("nft")
            .args(["-j", "list", "set", "inet", &self.config.table, "links"])
            .output()
            .map_err(|e| DataplaneError::Nft {
                table: self.config.table.clone(),
                message: format!("running nft: {e}"),
            })?;
        if !out.status.success() {
            return Err(DataplaneError::Nft {
                table: self.config.table.clone(),
                message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        set_elements(&out.stdout).map_err(|e| DataplaneError::Nft {
            table: self.config.table.clone(),
            message: format!("nft's JSON: {e}"),
        })
    }

    /// Remove the table (and every rule in it).
    pub fn teardown(&self) -> Result<(), DataplaneError> {
        let t = self.table_obj();
        self.run(vec![
            json!({ "add": { "table": t } }),
            json!({ "delete": { "table": t } }),
        ])
    }

    fn table_obj(&self) -> Value {
        json!({ "family": "inet", "name": self.config.table })
    }

    fn set_obj(&self, name: &str, ty: &str, interval: bool, elem: Option<Vec<Value>>) -> Value {
        let mut set =
            json!({ "family": "inet", "table": self.config.table, "name": name, "type": ty });
        if interval {
            set["flags"] = json!(["interval"]);
        }
        if let Some(e) = elem.filter(|e| !e.is_empty()) {
            set["elem"] = Value::Array(e);
        }
        set
    }

    fn sets(&self, links: &[String]) -> Vec<Value> {
        let c = &self.config;
        let mut out = vec![
            json!({ "add": { "set": self.set_obj("links", "ifname", false, Some(links.iter().map(|l| json!(l)).collect())) } }),
        ];
        for (base, nets) in [
            ("never", &c.never),
            ("allow", &c.operator_allow),
            ("deny", &c.deny),
        ] {
            let (v4, v6): (Vec<IpNet>, Vec<IpNet>) = IpNet::aggregate(nets)
                .into_iter()
                .partition(|n| matches!(n, IpNet::V4(_)));
            out.push(json!({ "add": { "set": self.set_obj(&format!("{base}4"), "ipv4_addr", true, Some(prefixes(&v4))) } }));
            out.push(json!({ "add": { "set": self.set_obj(&format!("{base}6"), "ipv6_addr", true, Some(prefixes(&v6))) } }));
        }
        out
    }

    fn chains(&self) -> Vec<Value> {
        let chain = |name: &str, ty: &str, hook: &str, prio: i32| json!({ "add": { "chain": { "family": "inet", "table": self.config.table, "name": name, "type": ty, "hook": hook, "prio": prio, "policy": "accept" } } });
        vec![
            chain("prerouting", "nat", "prerouting", -100),
            chain("input", "filter", "input", 0),
            chain("forward", "filter", "forward", 0),
            chain("postrouting", "nat", "postrouting", 100),
        ]
    }

    /// Every rule of the table, in order: steering, input, forward, postrouting.
    fn rules(&self) -> Vec<Value> {
        let mut out = self.steering();
        out.extend(self.input());
        out.extend(self.forward());
        out.extend(self.postrouting());
        out
    }

    fn rule(&self, chain: &str, expr: Vec<Value>) -> Value {
        json!({ "add": { "rule": { "family": "inet", "table": self.config.table, "chain": chain, "expr": expr } } })
    }

    /// Steering: DNS to the guard, web to the proxy; only what the fence marked.
    fn steering(&self) -> Vec<Value> {
        let c = &self.config;
        let steer = |mark: u32, proto: &str, port: u16| {
            self.rule(
                "prerouting",
                vec![
                    from_links(),
                    marked(mark),
                    l4(proto),
                    json!({ "redirect": { "port": port } }),
                ],
            )
        };
        vec![
            steer(mark::DNS, "udp", c.guard_port),
            steer(mark::DNS, "tcp", c.guard_port),
            steer(mark::PROXY, "tcp", c.proxy_port),
        ]
    }

    /// Input from guests: the guard, the proxy, neighbour discovery; nothing else.
    fn input(&self) -> Vec<Value> {
        let c = &self.config;
        let rule = |expr| self.rule("input", expr);
        let open = |proto: &str, port: u16| {
            rule(vec![
                from_links(),
                l4(proto),
                dport(proto, port),
                accept_verdict(),
            ])
        };
        vec![
            open("udp", c.guard_port),
            open("tcp", c.guard_port),
            open("tcp", c.proxy_port),
            rule(vec![
                from_links(),
                l4("ipv6-icmp"),
                m(
                    "==",
                    json!({ "payload": { "protocol": "icmpv6", "field": "type" } }),
                    json!({ "set": ["nd-router-solicit", "nd-neighbor-solicit", "nd-neighbor-advert"] }),
                ),
                accept_verdict(),
            ]),
            rule(vec![from_links(), drop_verdict()]),
        ]
    }

    /// Forward: the second layer.
    fn forward(&self) -> Vec<Value> {
        let rule = |expr| self.rule("forward", expr);
        vec![
            rule(vec![from_links(), marked(mark::DNS), drop_verdict()]),
            rule(vec![from_links(), marked(mark::PROXY), drop_verdict()]),
            rule(vec![from_links(), daddr("ip", "never4"), drop_verdict()]),
            rule(vec![from_links(), daddr("ip6", "never6"), drop_verdict()]),
            rule(vec![from_links(), daddr("ip", "allow4"), accept_verdict()]),
            rule(vec![from_links(), daddr("ip6", "allow6"), accept_verdict()]),
            rule(vec![from_links(), daddr("ip", "deny4"), drop_verdict()]),
            rule(vec![from_links(), daddr("ip6", "deny6"), drop_verdict()]),
            rule(vec![
                to_links(),
                m(
                    "in",
                    json!({ "ct": { "key": "state" } }),
                    json!(["established", "related"]),
                ),
                accept_verdict(),
            ]),
            rule(vec![to_links(), drop_verdict()]),
        ]
    }

    /// Out of the host: masquerade.
    fn postrouting(&self) -> Vec<Value> {
        vec![self.rule(
            "postrouting",
            vec![
                from_links(),
                m("!=", meta("oifname"), json!("@links")),
                json!({ "masquerade": null }),
            ],
        )]
    }

    fn run(&self, batch: Vec<Value>) -> Result<(), DataplaneError> {
        let doc = json!({ "nftables": batch });
        let typed: nftables::schema::Nftables =
            serde_json::from_value(doc).map_err(|e| DataplaneError::Nft {
                table: self.config.table.clone(),
                message: format!("the generated ruleset does not fit the nftables schema: {e}"),
            })?;
        nftables::helper::apply_ruleset_with_args(&typed, None::<&str>, std::iter::empty::<&str>())
            .map_err(|e| DataplaneError::Nft {
                table: self.config.table.clone(),
                message: e.to_string(),
            })
    }
}

fn m(op: &str, left: Value, right: Value) -> Value {
    json!({ "match": { "op": op, "left": left, "right": right } })
}

fn meta(key: &str) -> Value {
    json!({ "meta": { "key": key } })
}

fn from_links() -> Value {
    m("==", meta("iifname"), json!("@links"))
}

fn to_links() -> Value {
    m("==", meta("oifname"), json!("@links"))
}

fn marked(v: u32) -> Value {
    m("==", meta("mark"), json!(v))
}

fn l4(p: &str) -> Value {
    m("==", meta("l4proto"), json!(p))
}

fn daddr(fam: &str, set: &str) -> Value {
    m(
        "==",
        json!({ "payload": { "protocol": fam, "field": "daddr" } }),
        json!(format!("@{set}")),
    )
}

fn dport(p: &str, port: u16) -> Value {
    m(
        "==",
        json!({ "payload": { "protocol": p, "field": "dport" } }),
        json!(port),
    )
}

fn drop_verdict() -> Value {
    json!({ "drop": null })
}

fn accept_verdict() -> Value {
    json!({ "accept": null })
}

fn prefixes(nets: &[IpNet]) -> Vec<Value> {
    nets.iter()
        .map(|n| json!({ "prefix": { "addr": n.network().to_string(), "len": n.prefix_len() } }))
        .collect()
}

/// The elements of the set `nft -j list set …` printed as `json` (names), sorted.
pub fn set_elements(json: &[u8]) -> Result<Vec<String>, serde_json::Error> {
    let v: Value = serde_json::from_slice(json)?;
    let mut elements: Vec<String> = v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["set"]["elem"].as_array())
        .flatten()
        .filter_map(|e| e.as_str().map(str::to_owned))
        .collect();
    elements.sort();
    Ok(elements)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nft() -> Nft {
        Nft::new(NftConfig {
            table: "svc_test".into(),
            guard_port: 5353,
            proxy_port: 3128,
            never: vec!["10.0.0.0/8".parse().expect("net")],
            deny: vec!["169.254.0.0/16".parse().expect("net")],
            operator_allow: vec![],
        })
    }

    #[test]
    fn the_rules_go_steering_input_forward_postrouting_in_that_order() {
        let chains: Vec<String> = nft()
            .rules()
            .iter()
            .map(|r| r["add"]["rule"]["chain"].as_str().unwrap_or("").to_owned())
            .collect();
        let want: Vec<&str> = [("prerouting", 3), ("input", 5), ("forward", 10)]
            .into_iter()
            .flat_map(|(c, n)| std::iter::repeat_n(c, n))
            .chain(["postrouting"])
            .collect();
        assert_eq!(chains, want);
        for r in nft().rules() {
            assert_eq!(r["add"]["rule"]["table"], "svc_test", "{r}");
            assert_eq!(r["add"]["rule"]["family"], "inet", "{r}");
        }
    }

    #[test]
    fn the_whole_table_fits_the_nftables_schema() {
        let n = nft();
        let mut batch = vec![json!({ "add": { "table": n.table_obj() } })];
        batch.extend(n.sets(&["svc-t0".into()]));
        batch.extend(n.chains());
        batch.extend(n.rules());
        let typed: Result<nftables::schema::Nftables, _> =
            serde_json::from_value(json!({ "nftables": batch }));
        assert!(typed.is_ok(), "{typed:?}");
    }

    #[test]
    fn only_marked_traffic_is_steered_and_the_last_input_rule_drops() {
        let rules = nft().rules();
        let marks: Vec<u64> = rules[..3]
            .iter()
            .filter_map(|r| r["add"]["rule"]["expr"][1]["match"]["right"].as_u64())
            .collect();
        assert_eq!(
            marks,
            [
                u64::from(mark::DNS),
                u64::from(mark::DNS),
                u64::from(mark::PROXY)
            ]
        );
        assert_eq!(rules[7]["add"]["rule"]["expr"][1], json!({ "drop": null }));
        assert_eq!(rules[17]["add"]["rule"]["expr"][1], json!({ "drop": null }));
    }
}
