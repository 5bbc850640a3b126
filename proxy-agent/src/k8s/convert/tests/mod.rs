// SPDX-License-Identifier: Apache-2.0
mod bad_input;
mod endpointslice;
mod objects;
mod service;
