//! Panics on purpose, for the tests that check what a panic leaves behind (the terminal given
//! back, a worker's panic reported as a finding). Debug builds only: set `STUI_FAULT` to a place
//! name (`draw`, `scan`). Release builds compile every call to nothing.

#[cfg(debug_assertions)]
pub fn inject(place: &str) {
    let wanted = std::env::var("STUI_FAULT").is_ok_and(|wanted| wanted == place);
    assert!(!wanted, "fault injected at `{place}` (STUI_FAULT)");
}

#[cfg(not(debug_assertions))]
#[inline(always)]
pub fn inject(_place: &str) {}
