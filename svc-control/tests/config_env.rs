//! Environment variables: removed ones are errors naming each, microvm images need both.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::path::Path;

use svc_control::config::env;

#[test]
fn removed_variables_are_errors_naming_each() {
    for var in env::REMOVED_VARIABLES {
        let errors = env::check_removed(|v| (v == var).then(|| "1".to_owned()))
            .unwrap_err()
            .0;
        assert_eq!(errors.len(), 1);
        assert!(errors[0].message.contains(var), "{}", errors[0]);
        assert!(errors[0].message.contains("removed"), "{}", errors[0]);
    }
    let all = env::check_removed(|_| Some(String::new())).unwrap_err().0;
    assert_eq!(all.len(), 3);
    assert!(env::check_removed(|_| None).is_ok());
}

#[test]
fn microvm_images_need_both_variables() {
    let both = env::microvm_images(|v| Some(format!("/img/{v}"))).unwrap();
    assert_eq!(both.kernel, Path::new("/img/SVC_MICROVM_KERNEL"));
    let none = env::microvm_images(|_| None).unwrap_err().0;
    let vars: Vec<&str> = none.iter().map(|e| e.location.path.as_str()).collect();
    assert_eq!(vars, ["SVC_MICROVM_KERNEL", "SVC_MICROVM_ROOTFS"]);
}
