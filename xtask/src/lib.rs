// SPDX-License-Identifier: Apache-2.0
//! The parts of the tasks that tests reuse: the test VM with an IPVS kernel (`vm`), and
//! the helpers it shares with the task binary.

pub mod util;
pub mod vm;
