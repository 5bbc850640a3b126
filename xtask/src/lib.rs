// SPDX-License-Identifier: Apache-2.0
//! The parts of the tasks that tests reuse: the test VM with an IPVS kernel (`vm`), the
//! agent image's runtime tree (`image`), and the helpers they share with the task binary.

pub mod image;
pub mod oci;
pub mod util;
pub mod vm;
