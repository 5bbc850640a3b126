// SPDX-License-Identifier: Apache-2.0
mod endpointslice;
mod objects;
mod service;
