//! The servers' own HTTP APIs (Hysteria's Traffic Stats, the Clash API of sing-box and mihomo), polled on a thread of their own.

pub mod api_poll;
pub mod clash_api;
pub mod hysteria_api;
