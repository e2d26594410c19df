"""
Function RPCs of the local Modal server: creating an app's functions and their
variants, calling them, polling and cancelling calls.

Served, each with the client code it answers (modal 1.6.4):

- ``FunctionPrecreate`` then ``FunctionCreate``: each ``app.function`` when the app
  runs (modal/_functions.py, ``_Function.from_local``: ``_preload`` and ``_load``;
  modal/runner.py, ``_create_all_objects``). ``FunctionCreate`` carries one
  ``Function``, or for a GPU fallback list a ``FunctionData`` with one ranked
  ``Function`` per GPU; each is kept as received
  (:attr:`~.state.FunctionRecord.definitions`: ``timeout_secs``,
  ``startup_timeout_secs``, ``resources.gpu_config``, ``volume_mounts``,
  ``secret_ids``...). The answer carries ``function_data`` with its ranked functions
  (the client reads it, ``FunctionInfo._from_function_proto``, modal/types.py) and
  handle metadata without ``input_plane_url``, so calls go through ``FunctionMap``
  (``_Function._call_function_nowait``).
- ``FunctionBindParams``: ``with_options`` (modal/_function_variants.py,
  ``_FunctionOptions.to_proto``): a variant whose definitions are the base's with the
  options applied: ``timeout_secs`` when set, ``resources`` merged field by field
  (protobuf ``MergeFrom``: an option's empty ``gpu_config`` leaves the base's GPU),
  secrets and volumes replaced where ``replace_*`` says. ``FunctionOptions`` has no
  start-up timeout, so a variant keeps the base's ``startup_timeout_secs``. What
  Modal's server does with the options is not in the client: the options are
  recorded as received (:attr:`~.state.FunctionRecord.options`) for tests to read.
  The same request gives the same variant (the client caches it too,
  ``_bind_params_cached``).
- ``FunctionMap`` (one pipelined input: ``spawn``, ``remote``; modal/_functions.py,
  ``_Invocation.create``) and ``FunctionPutInputs`` (its input sent apart): each input
  starts a container (:mod:`.containers`).
- ``FunctionGetOutputs``: ``FunctionCall.get(timeout=...)`` and ``remote``
  (``_Invocation.pop_function_call_outputs``): waits up to the request's ``timeout``
  for the output; no output answers ``num_unfinished_inputs=1``, which the client
  turns into ``TimeoutError`` (``poll_function``); an output cleared by
  ``clear_on_success`` answers ``num_unfinished_inputs=0`` (``OutputExpiredError``).
  A call the server never answers (``Faults.unanswered``, :class:`~.faults.
  Unanswered`) always answers as unfinished.
- ``FunctionCallCancel``: ``FunctionCall.cancel`` (modal/_functions.py). With
  ``terminate_containers`` the input's container is killed at once; without, the
  cancel reaches the container at its next heartbeat (:mod:`.containers`). Either way
  the input ends ``GENERIC_STATUS_TERMINATED``.
- ``BlobGet``: large arguments and results (``blob_download``,
  modal/_utils/blob_utils.py).

Not served (UNIMPLEMENTED): maps of several inputs, generators' data streams, input
retries (``FunctionRetryInputs``), deployed functions (``FunctionGet``).
"""

from __future__ import annotations

import asyncio

from google.protobuf import empty_pb2
from grpclib import GRPCError, Status
from modal_proto import api_pb2

from .state import FunctionCallRecord, FunctionRecord, new_id

__all__ = ["FunctionRpcs"]

_S = api_pb2.GenericResult


class FunctionRpcs:
    """
    Mixin of the local Modal server serving functions and their calls (see the
    module's docstring). Needs the methods of :class:`~.containers.ContainerRpcs`.
    """

    def _function(self, function_id: str) -> FunctionRecord:
        with self.state.lock:
            function = self.state.functions.get(function_id)
        if function is None:
            raise GRPCError(Status.NOT_FOUND, f"Function {function_id} not found")
        return function

    def _call(self, function_call_id: str) -> FunctionCallRecord:
        with self.state.lock:
            call = self.state.function_calls.get(function_call_id)
        if call is None:
            raise GRPCError(
                Status.NOT_FOUND, f"Function call {function_call_id} not found"
            )
        return call

    def _handle_metadata(
        self, function: FunctionRecord
    ) -> api_pb2.FunctionHandleMetadata:
        """Handle metadata of a created function: no input plane (module docstring)."""
        d = function.definition
        return api_pb2.FunctionHandleMetadata(
            function_name=d.function_name,
            function_type=d.function_type,
            definition_id=f"de-{function.function_id[3:]}",
            function_schema=d.function_schema,
            supported_input_formats=d.supported_input_formats,
            supported_output_formats=d.supported_output_formats,
            app_id=function.app_id,
            base_function_id=function.base_function_id,
        )

    async def FunctionPrecreate(self, stream) -> None:
        """
        Reserve a function id in an app; answer its handle metadata from the request.

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown app.
        """
        req = await stream.recv_message()
        self._app(req.app_id)
        function_id = req.existing_function_id or new_id("fu")
        with self.state.lock:
            self.state.functions[function_id] = FunctionRecord(
                function_id=function_id, app_id=req.app_id, name=req.function_name
            )
        await stream.send_message(
            api_pb2.FunctionPrecreateResponse(
                function_id=function_id,
                handle_metadata=api_pb2.FunctionHandleMetadata(
                    function_name=req.function_name,
                    function_type=req.function_type,
                    function_schema=req.function_schema,
                    supported_input_formats=req.supported_input_formats,
                    supported_output_formats=req.supported_output_formats,
                    app_id=req.app_id,
                ),
            )
        )

    async def FunctionCreate(self, stream) -> None:
        """
        Record a function's definition(s) as received; answer them with its handle
        metadata.

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown app; INVALID_ARGUMENT for a request with neither
            a function nor ranked functions.
        """
        req = await stream.recv_message()
        self._app(req.app_id)
        if req.function_data.ranked_functions:
            ranked = sorted(req.function_data.ranked_functions, key=lambda r: r.rank)
            definitions = [r.function for r in ranked]
        elif req.HasField("function"):
            definitions = [req.function]
        else:
            raise GRPCError(Status.INVALID_ARGUMENT, "no function definition")
        function_id = req.existing_function_id or new_id("fu")
        function = FunctionRecord(
            function_id=function_id,
            app_id=req.app_id,
            name=definitions[0].function_name,
            definitions=definitions,
            create_request=req,
        )
        with self.state.lock:
            self.state.functions[function_id] = function
        function_data = api_pb2.FunctionData(
            module_name=definitions[0].module_name,
            function_name=definitions[0].function_name,
            function_type=definitions[0].function_type,
            timeout_secs=definitions[0].timeout_secs,
            startup_timeout_secs=definitions[0].startup_timeout_secs,
        )
        for rank, d in enumerate(definitions):
            function_data.ranked_functions.append(
                api_pb2.FunctionData.RankedFunction(rank=rank, function=d)
            )
        response = api_pb2.FunctionCreateResponse(
            function_id=function_id,
            handle_metadata=self._handle_metadata(function),
            function_data=function_data,
        )
        if not req.function_data.ranked_functions:
            response.function.CopyFrom(definitions[0])
        await stream.send_message(response)

    async def FunctionBindParams(self, stream) -> None:
        """
        Make (or find) the variant of a function with the request's options.

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown function; UNIMPLEMENTED for parameters (classes).
        """
        req = await stream.recv_message()
        base = self._function(req.function_id)
        if req.serialized_params:
            raise GRPCError(
                Status.UNIMPLEMENTED,
                "UNIMPLEMENTED: FunctionBindParams with parameters",
            )
        key = req.SerializeToString(deterministic=True)
        variants = self.__dict__.setdefault("_variants", {})
        with self.state.lock:
            variant = self.state.functions.get(variants.get(key, ""))
        if variant is None:
            options = req.function_options
            definitions = []
            for d in base.definitions:
                v = api_pb2.Function()
                v.CopyFrom(d)
                if options.HasField("timeout_secs"):
                    v.timeout_secs = options.timeout_secs
                if options.HasField("resources"):
                    v.resources.MergeFrom(options.resources)
                if options.replace_secret_ids:
                    v.ClearField("secret_ids")
                    v.secret_ids.extend(options.secret_ids)
                if options.replace_volume_mounts:
                    v.ClearField("volume_mounts")
                    v.volume_mounts.extend(options.volume_mounts)
                definitions.append(v)
            variant = FunctionRecord(
                function_id=new_id("fu"),
                app_id=base.app_id,
                name=base.name,
                definitions=definitions,
                base_function_id=base.function_id,
                options=options,
            )
            with self.state.lock:
                self.state.functions[variant.function_id] = variant
                variants[key] = variant.function_id
        await stream.send_message(
            api_pb2.FunctionBindParamsResponse(
                bound_function_id=variant.function_id,
                handle_metadata=self._handle_metadata(variant),
            )
        )

    def _add_input(
        self, call: FunctionCallRecord, item: api_pb2.FunctionPutInputsItem
    ) -> api_pb2.FunctionPutInputsResponseItem:
        with self.state.lock:
            call.input_id = new_id("in")
            call.function_input = item.input
        self._queue_container(call)
        return api_pb2.FunctionPutInputsResponseItem(
            idx=item.idx, input_id=call.input_id, input_jwt=f"jwt-{call.input_id}"
        )

    async def FunctionMap(self, stream) -> None:
        """
        Make a function call; its pipelined input, if any, starts a container.

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown function; FAILED_PRECONDITION for a function not
            created yet or whose app is stopped; UNIMPLEMENTED for more than one input
            or a non-unary call.
        """
        req = await stream.recv_message()
        function = self._function(req.function_id)
        app = self._app(function.app_id)
        if len(req.pipelined_inputs) > 1 or (
            req.function_call_type != api_pb2.FUNCTION_CALL_TYPE_UNARY
        ):
            raise GRPCError(
                Status.UNIMPLEMENTED, "UNIMPLEMENTED: FunctionMap of several inputs"
            )
        if not function.definitions:
            raise GRPCError(
                Status.FAILED_PRECONDITION,
                f"Function {function.function_id} not created",
            )
        if app.state == api_pb2.APP_STATE_STOPPED:
            raise GRPCError(
                Status.FAILED_PRECONDITION,
                f"App {app.app_id} is stopped ({app.stop_reason})",
            )
        call = FunctionCallRecord(
            function_call_id=new_id("fc"),
            function_id=function.function_id,
            input_id="",
            function_input=api_pb2.FunctionInput(),
            invocation_type=req.function_call_invocation_type,
            created_at=self.state.now(),
        )
        with self.state.lock:
            self.state.function_calls[call.function_call_id] = call
            if self.state.faults.unanswered is not None:
                self.state.faults.unanswered.take(call.function_call_id)
        items = [self._add_input(call, item) for item in req.pipelined_inputs]
        await stream.send_message(
            api_pb2.FunctionMapResponse(
                function_call_id=call.function_call_id,
                pipelined_inputs=items,
                function_call_jwt=f"jwt-{call.function_call_id}",
                max_inputs_outstanding=1000,
            )
        )

    async def FunctionPutInputs(self, stream) -> None:
        """
        Add the input of a call made without one; it starts a container.

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown call; UNIMPLEMENTED for a second input.
        """
        req = await stream.recv_message()
        call = self._call(req.function_call_id)
        if call.input_id or len(req.inputs) != 1:
            raise GRPCError(
                Status.UNIMPLEMENTED, "UNIMPLEMENTED: more than one input per call"
            )
        items = [self._add_input(call, item) for item in req.inputs]
        await stream.send_message(api_pb2.FunctionPutInputsResponse(inputs=items))

    async def FunctionGetOutputs(self, stream) -> None:
        """
        Answer a call's output, waiting up to the request's ``timeout`` seconds for it
        (see the module's docstring).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown call.
        """
        req = await stream.recv_message()
        call = self._call(req.function_call_id)
        unanswered = self.state.faults.unanswered
        if unanswered is not None and call.function_call_id in unanswered.call_ids:
            await asyncio.sleep(req.timeout)  # its output never comes
            await stream.send_message(
                api_pb2.FunctionGetOutputsResponse(num_unfinished_inputs=1)
            )
            return
        if call.output is None and req.timeout > 0:
            try:
                await asyncio.wait_for(
                    self._output_event(call).wait(), timeout=req.timeout
                )
            except TimeoutError:
                pass
        cleared = self.__dict__.setdefault("_cleared_calls", set())
        with self.state.lock:
            output = call.output
            if call.function_call_id in cleared:
                response = api_pb2.FunctionGetOutputsResponse(num_unfinished_inputs=0)
            elif output is None:
                response = api_pb2.FunctionGetOutputsResponse(num_unfinished_inputs=1)
            else:
                response = api_pb2.FunctionGetOutputsResponse(
                    outputs=[output], idxs=[0], num_unfinished_inputs=0
                )
                if (
                    req.clear_on_success
                    and output.result.status == _S.GENERIC_STATUS_SUCCESS
                ):
                    cleared.add(call.function_call_id)
        await stream.send_message(response)

    async def FunctionCallCancel(self, stream) -> None:
        """
        Cancel a call's input (see the module's docstring).

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for an unknown call.
        """
        req = await stream.recv_message()
        call = self._call(req.function_call_id)
        with self.state.lock:
            call.cancelled = True
            containers = [
                self.state.containers[t]
                for t in call.task_ids
                if self.state.containers[t].running
            ]
        if call.output is None:
            killed = False
            for container in containers:
                if req.terminate_containers or container.input_at is None:
                    self._kill(container, "cancelled")
                    killed = True
                else:
                    with self.state.lock:
                        container.cancel_input_ids.append(call.input_id)
            if killed or not containers:
                self._set_output(
                    call,
                    api_pb2.GenericResult(
                        status=_S.GENERIC_STATUS_TERMINATED,
                        exception="the function call was cancelled",
                    ),
                )
        await stream.send_message(empty_pb2.Empty())

    async def BlobGet(self, stream) -> None:
        """
        Answer a blob's download URL.

        Raises
        ------
        grpclib.GRPCError
            NOT_FOUND for a blob never uploaded.
        """
        req = await stream.recv_message()
        if self.store.blob_bytes(req.blob_id) is None:
            raise GRPCError(Status.NOT_FOUND, f"Blob {req.blob_id} not found")
        await stream.send_message(
            api_pb2.BlobGetResponse(download_url=f"{self.base_url}/blobs/{req.blob_id}")
        )
