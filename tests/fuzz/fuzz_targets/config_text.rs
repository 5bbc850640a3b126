// SPDX-License-Identifier: Apache-2.0
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = proxy_agent::fuzz::config_text(data);
});
