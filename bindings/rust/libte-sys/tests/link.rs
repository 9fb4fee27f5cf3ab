//! The library the -sys crate linked against is the one the bindings were generated from.

use libte_sys as sys;
use std::ffi::CStr;

#[test]
fn loaded_library_matches_header_version() {
    let version = unsafe { sys::te_version() };
    assert_eq!(version, sys::TE_VERSION_NUMBER);
    let text = unsafe { CStr::from_ptr(sys::te_version_string()) };
    let expected = format!(
        "{}.{}.{}",
        sys::TE_VERSION_MAJOR,
        sys::TE_VERSION_MINOR,
        sys::TE_VERSION_PATCH
    );
    assert_eq!(text.to_str().unwrap(), expected);
}

#[test]
fn unknown_status_values_are_representable() {
    // A newtype, not a Rust enum: a status this binding does not know is an ordinary value.
    let future = sys::te_status(1000);
    let text = unsafe { CStr::from_ptr(sys::te_status_string(future)) };
    assert_eq!(text.to_str().unwrap(), "TE_ERROR_UNKNOWN");
}
