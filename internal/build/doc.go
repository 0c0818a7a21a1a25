// Package build makes templates: it parses the build spec (a Dockerfile subset), runs each step in a build sandbox of airlock's own driver, caches the resulting layers by their inputs, imports OCI images and keeps the catalog of template versions.
//
// A build turns FROM into the parent's layers, then walks the steps. ENV,
// WORKDIR and USER only change the state later steps run with (and, kept in
// the version's config, the env and the default cwd and user of the
// template's sandboxes' execs). RUN and COPY
// each make one layer: the builder computes the layer's key from the parent
// layer, the instruction, its inputs (the files COPY reads) and the state,
// and reuses the layer when the store has it. Otherwise it creates a build
// sandbox whose read-only layers are the layers so far, runs the step
// through the sandbox's agent (RUN: /bin/sh -c as USER with ENV in
// WORKDIR; COPY: the selected files of the build context unpacked as
// root), stops the sandbox and copies its writable layer, ids shifted back,
// into the layer store. The new version is registered only when every step
// succeeded.
package build
