// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
//! tc programs on the node's devices. tc fails closed: traffic to a service frontend that
//! upstream would DROP is dropped here.

pub mod egress;
