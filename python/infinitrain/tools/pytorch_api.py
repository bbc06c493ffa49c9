"""The PyTorch compatibility report: probes this package for a list of PyTorch's most used public names and writes
docs/pytorch_api.md (present, differs with how, missing), with the coverage.

    python -m infinitrain.tools.pytorch_api [--output docs/pytorch_api.md] [--check]

Each name is looked up where PyTorch has it (torch.X as it.X, Tensor.X as it.Tensor.X, nn, nn.functional as F,
optim, utils, cuda, amp, backends, distributed, autograd). A callable is present when it accepts PyTorch's
parameters: positionally where PyTorch takes them positionally, and by their names where PyTorch's are
keyword-only; out=, layout= and memory_format= are left out of the comparison (no name here accepts them). A name
whose behaviour differs in a way the program can observe is listed with how (NOTES). Behaviour is tested by the
shared suites against float64 NumPy, not by this probe.

The list and its parameter lists come from PyTorch 2.15's public API (its signatures and documented signatures):
one line a name, "<name> <kind> <params>", params comma-separated, ':' marking keyword-only ones.
"""

import argparse
import inspect
import keyword
import sys

NAMES = """
torch.tensor callable data,:dtype,:device,:requires_grad,:pin_memory
torch.as_tensor callable data,:dtype,:device
torch.from_numpy callable ndarray
torch.zeros callable *size,:out,:dtype,:layout,:device,:requires_grad
torch.ones callable *size,:out,:dtype,:layout,:device,:requires_grad
torch.empty callable *size,:out,:dtype,:layout,:device,:requires_grad,:pin_memory,:memory_format
torch.full callable size,fill_value,:out,:dtype,:layout,:device,:requires_grad
torch.zeros_like callable input,:dtype,:layout,:device,:requires_grad,:memory_format
torch.ones_like callable input,:dtype,:layout,:device,:requires_grad,:memory_format
torch.empty_like callable input,:dtype,:layout,:device,:requires_grad,:memory_format
torch.full_like callable input,fill_value,:dtype,:layout,:device,:requires_grad,:memory_format
torch.rand callable *size,:generator,:out,:dtype,:layout,:device,:requires_grad,:pin_memory
torch.randn callable *size,:generator,:out,:dtype,:layout,:device,:requires_grad,:pin_memory
torch.randint callable low,high,size,:generator,:out,:dtype,:layout,:device,:requires_grad
torch.randperm callable n,:generator,:out,:dtype,:layout,:device,:requires_grad,:pin_memory
torch.rand_like callable input,:generator,:dtype,:layout,:device,:requires_grad,:memory_format
torch.randn_like callable input,:generator,:dtype,:layout,:device,:requires_grad,:memory_format
torch.randint_like callable input,low,high,:generator,:dtype,:layout,:device,:requires_grad,:memory_format
torch.arange callable start,end,step,:out,:dtype,:layout,:device,:requires_grad
torch.linspace callable start,end,steps,:out,:dtype,:layout,:device,:requires_grad
torch.logspace callable start,end,steps,base,:out,:dtype,:layout,:device,:requires_grad
torch.eye callable n,m,:out,:dtype,:layout,:device,:requires_grad
torch.normal callable mean,std,:generator,:out
torch.bernoulli callable input,:generator,:out
torch.multinomial callable input,num_samples,replacement,:generator,:out
torch.manual_seed callable seed
torch.seed callable
torch.initial_seed callable
torch.get_rng_state callable
torch.set_rng_state callable new_state
torch.Generator class *args,**kwargs
torch.no_grad class
torch.enable_grad class *args,**kwargs
torch.inference_mode class mode
torch.set_grad_enabled class mode
torch.is_grad_enabled callable
torch.is_inference_mode_enabled callable
torch.cat callable tensors,dim,:out
torch.concat callable tensors,dim,:out
torch.concatenate callable tensors,axis,out
torch.stack callable tensors,dim,:out
torch.hstack callable tensors,:out
torch.vstack callable tensors,:out
torch.split callable tensor,split_size_or_sections,dim
torch.chunk callable input,chunks,dim
torch.tensor_split callable input,indices_or_sections,dim
torch.unbind callable input,dim
torch.squeeze callable input,dim
torch.unsqueeze callable input,dim
torch.reshape callable input,shape
torch.flatten callable input,start_dim,end_dim
torch.unflatten callable input,dim,sizes
torch.transpose callable input,dim0,dim1
torch.permute callable input,dims
torch.movedim callable input,source,destination
torch.t callable input
torch.swapaxes callable input,axis0,axis1
torch.narrow callable input,dim,start,length
torch.gather callable input,dim,index,:sparse_grad,:out
torch.scatter callable input,dim,index,src
torch.scatter_add callable input,dim,index,src
torch.index_select callable input,dim,index,:out
torch.masked_select callable input,mask,:out
torch.masked_fill callable input,mask,value
torch.take_along_dim callable input,indices,dim,:out
torch.where callable condition,input,other,:out
torch.nonzero callable input,:out,:as_tuple
torch.argwhere callable input
torch.tril callable input,diagonal,:out
torch.triu callable input,diagonal,:out
torch.diag callable input,diagonal,:out
torch.diagonal callable input,offset,dim1,dim2
torch.trace callable input
torch.flip callable input,dims
torch.roll callable input,shifts,dims
torch.repeat_interleave callable input,repeats,dim,:output_size
torch.tile callable input,dims
torch.broadcast_to callable input,shape
torch.broadcast_tensors callable *tensors
torch.meshgrid callable *tensors,:indexing
torch.clamp callable input,min,max,:out
torch.clip callable input,min,max,:out
torch.abs callable input,:out
torch.neg callable input,:out
torch.exp callable input,:out
torch.exp2 callable input,:out
torch.log callable input,:out
torch.log2 callable input,:out
torch.log10 callable input,:out
torch.log1p callable input,:out
torch.expm1 callable input,:out
torch.sqrt callable input,:out
torch.rsqrt callable input,:out
torch.square callable input,:out
torch.pow callable input,exponent,:out
torch.sin callable input,:out
torch.cos callable input,:out
torch.tan callable input,:out
torch.tanh callable input,:out
torch.sigmoid callable input,:out
torch.atan2 callable input,other,:out
torch.erf callable input,:out
torch.erfc callable input,:out
torch.floor callable input,:out
torch.ceil callable input,:out
torch.round callable input,:decimals,:out
torch.trunc callable input,:out
torch.sign callable input,:out
torch.reciprocal callable input,:out
torch.add callable input,other,:alpha,:out
torch.sub callable input,other,:alpha,:out
torch.mul callable input,other,:out
torch.div callable input,other,:rounding_mode,:out
torch.true_divide callable dividend,divisor,:out
torch.floor_divide callable input,other,:out
torch.remainder callable input,other,:out
torch.fmod callable input,other,:out
torch.maximum callable input,other,:out
torch.minimum callable input,other,:out
torch.lerp callable input,end,weight,:out
torch.addcmul callable input,tensor1,tensor2,:value,:out
torch.addcdiv callable input,tensor1,tensor2,:value,:out
torch.relu callable input
torch.softmax callable input,dim,:dtype
torch.log_softmax callable input,dim,:dtype
torch.nan_to_num callable input,nan,posinf,neginf,:out
torch.sum callable input,:dtype
torch.mean callable input,:dtype
torch.std callable input,dim,:correction,:keepdim,:out
torch.var callable input,dim,:correction,:keepdim,:out
torch.var_mean callable input,dim,:correction,:keepdim,:out
torch.std_mean callable input,dim,:correction,:keepdim,:out
torch.prod callable input,:dtype
torch.cumsum callable input,dim,:dtype,:out
torch.cumprod callable input,dim,:dtype,:out
torch.logsumexp callable input,dim,keepdim,:out
torch.amax callable input,dim,keepdim,:out
torch.amin callable input,dim,keepdim,:out
torch.max callable input,:out
torch.min callable input,:out
torch.argmax callable input
torch.argmin callable input,dim,keepdim
torch.all callable input,:out
torch.any callable input,:out
torch.norm callable input,p,dim,keepdim,out,dtype
torch.dist callable input,other,p
torch.topk callable input,k,dim,largest,sorted,:out
torch.sort callable input,dim,descending,:stable,:out
torch.argsort callable input,dim,descending,:stable
torch.kthvalue callable input,k,dim,keepdim,:out
torch.median callable input
torch.unique callable *args,**kwargs
torch.bincount callable input,weights,minlength
torch.count_nonzero callable input,dim
torch.matmul callable input,other,:out
torch.mm callable input,mat2,:out
torch.bmm callable input,mat2,:out
torch.baddbmm callable input,batch1,batch2,:beta,:alpha,:out
torch.addmm callable input,mat1,mat2,:beta,:alpha,:out
torch.mv callable input,vec,:out
torch.dot callable input,tensor,:out
torch.outer callable input,vec2,:out
torch.einsum callable *args
torch.cdist callable x1,x2,p,compute_mode
torch.isnan callable input
torch.isinf callable input
torch.isfinite callable input
torch.isclose callable input,other,rtol,atol,equal_nan
torch.allclose callable input,other,rtol,atol,equal_nan
torch.equal callable input,other
torch.eq callable input,other,:out
torch.ne callable input,other,:out
torch.lt callable input,other,:out
torch.le callable input,other,:out
torch.gt callable input,other,:out
torch.ge callable input,other,:out
torch.logical_and callable input,other,:out
torch.logical_or callable input,other,:out
torch.logical_not callable input,:out
torch.logical_xor callable input,other,:out
torch.numel callable input
torch.is_tensor callable obj
torch.is_floating_point callable input
torch.result_type callable tensor1,tensor2
torch.promote_types callable type1,type2
torch.get_default_dtype callable
torch.set_default_dtype callable d
torch.finfo class *args,**kwargs
torch.iinfo class *args,**kwargs
torch.device class *args,**kwargs
torch.dtype class *args,**kwargs
torch.Tensor class *args,**kwargs
torch.float32 value
torch.float16 value
torch.bfloat16 value
torch.float64 value
torch.float8_e4m3fn value
torch.float8_e5m2 value
torch.int64 value
torch.int32 value
torch.int8 value
torch.uint8 value
torch.bool value
torch.long value
torch.float value
torch.half value
torch.double value
torch.int value
torch.save callable obj,f,pickle_module,pickle_protocol,_use_new_zipfile_serialization,_disable_byteorder_record
torch.load callable f,map_location,pickle_module,:weights_only,:mmap,**pickle_load_args
torch.compile callable model,:fullgraph,:dynamic,:backend,:mode,:options,:name,:disable,:recompile_limit,:isolate_recompiles,:dynamic_shapes
torch.set_num_threads callable int
torch.get_num_threads callable
torch.set_float32_matmul_precision callable precision
torch.get_float32_matmul_precision callable
torch.use_deterministic_algorithms callable mode,:warn_only
torch.autocast class device_type,dtype,enabled,cache_enabled
torch.clone callable input,:memory_format
torch.detach callable input
Tensor.shape value
Tensor.dtype value
Tensor.device value
Tensor.ndim value
Tensor.size callable dim
Tensor.dim callable
Tensor.numel callable
Tensor.item callable
Tensor.tolist callable
Tensor.numpy callable :force
Tensor.to callable *args,**kwargs
Tensor.cpu callable memory_format
Tensor.cuda callable device,non_blocking,memory_format
Tensor.float callable memory_format
Tensor.half callable memory_format
Tensor.bfloat16 callable memory_format
Tensor.double callable memory_format
Tensor.long callable memory_format
Tensor.int callable memory_format
Tensor.bool callable memory_format
Tensor.type_as callable tensor
Tensor.contiguous callable memory_format
Tensor.is_contiguous callable memory_format
Tensor.element_size callable
Tensor.nbytes value
Tensor.is_cuda value
Tensor.is_floating_point callable
Tensor.pin_memory callable
Tensor.is_pinned callable
Tensor.get_device callable
Tensor.data value
Tensor.view callable *shape
Tensor.view_as callable other
Tensor.reshape callable *shape
Tensor.reshape_as callable other
Tensor.expand callable *size
Tensor.expand_as callable other
Tensor.repeat callable *repeats
Tensor.permute callable *dims
Tensor.transpose callable dim0,dim1
Tensor.t callable
Tensor.T value
Tensor.mT value
Tensor.squeeze callable dim
Tensor.unsqueeze callable dim
Tensor.flatten callable start_dim,end_dim
Tensor.unflatten callable dim,sizes
Tensor.split callable split_size,dim
Tensor.chunk callable chunks,dim
Tensor.unbind callable dim
Tensor.narrow callable dimension,start,length
Tensor.flip callable dims
Tensor.roll callable shifts,dims
Tensor.repeat_interleave callable repeats,dim,:output_size
Tensor.tril callable diagonal
Tensor.triu callable diagonal
Tensor.masked_fill callable mask,value
Tensor.masked_fill_ callable mask,value
Tensor.index_select callable dim,index
Tensor.gather callable dim,index
Tensor.scatter callable dim,index,src
Tensor.scatter_ callable dim,index,src,:reduce
Tensor.scatter_add callable dim,index,src
Tensor.scatter_add_ callable dim,index,src
Tensor.index_add_ callable dim,index,source,:alpha
Tensor.clone callable :memory_format
Tensor.detach callable
Tensor.detach_ callable
Tensor.requires_grad_ callable requires_grad
Tensor.backward callable gradient,retain_graph,create_graph,inputs
Tensor.grad value
Tensor.requires_grad value
Tensor.is_leaf value
Tensor.grad_fn value
Tensor.register_hook callable hook
Tensor.retain_grad callable
Tensor.zero_ callable
Tensor.fill_ callable value
Tensor.copy_ callable src,non_blocking
Tensor.normal_ callable mean,std,:generator
Tensor.uniform_ callable from,to,:generator
Tensor.add_ callable other,:alpha
Tensor.sub_ callable other,:alpha
Tensor.mul_ callable value
Tensor.div_ callable value,:rounding_mode
Tensor.clamp_ callable min,max
Tensor.lerp_ callable end,weight
Tensor.addcmul_ callable tensor1,tensor2,:value
Tensor.sum callable dim,keepdim,dtype
Tensor.mean callable dim,keepdim,:dtype
Tensor.std callable dim,:correction,:keepdim
Tensor.var callable dim,:correction,:keepdim
Tensor.prod callable dim,keepdim,dtype
Tensor.max callable dim,keepdim
Tensor.min callable dim,keepdim
Tensor.amax callable dim,keepdim
Tensor.amin callable dim,keepdim
Tensor.argmax callable dim,keepdim
Tensor.argmin callable dim,keepdim
Tensor.softmax callable dim
Tensor.log_softmax callable dim,:dtype
Tensor.exp callable
Tensor.log callable
Tensor.sqrt callable
Tensor.rsqrt callable
Tensor.pow callable exponent
Tensor.abs callable
Tensor.neg callable
Tensor.tanh callable
Tensor.sigmoid callable
Tensor.relu callable
Tensor.sin callable
Tensor.cos callable
Tensor.clamp callable min,max
Tensor.clip callable min,max
Tensor.round callable decimals
Tensor.floor callable
Tensor.ceil callable
Tensor.sign callable
Tensor.square callable
Tensor.cumsum callable dim,dtype
Tensor.sort callable dim,descending
Tensor.argsort callable dim,descending
Tensor.topk callable k,dim,largest,sorted
Tensor.all callable dim,keepdim
Tensor.any callable dim,keepdim
Tensor.norm callable p,dim,keepdim,dtype
Tensor.logsumexp callable dim,keepdim
Tensor.matmul callable tensor2
Tensor.mm callable mat2
Tensor.bmm callable batch2
Tensor.eq callable other
Tensor.ne callable other
Tensor.lt callable other
Tensor.gt callable other
Tensor.le callable other
Tensor.ge callable other
Tensor.isnan callable
Tensor.isinf callable
Tensor.nonzero callable
Tensor.unique callable sorted,return_inverse,return_counts,dim
Tensor.where callable condition,y
Tensor.add callable other,:alpha
Tensor.sub callable other,:alpha
Tensor.mul callable value
Tensor.div callable value,:rounding_mode
Tensor.lerp callable end,weight
Tensor.new_zeros callable size,:dtype,:device,:requires_grad,:layout,:pin_memory
Tensor.new_ones callable size,:dtype,:device,:requires_grad,:layout,:pin_memory
Tensor.new_full callable size,fill_value,:dtype,:device,:requires_grad,:layout,:pin_memory
Tensor.new_empty callable size,:dtype,:device,:requires_grad,:layout,:pin_memory
Tensor.new_tensor callable data,:dtype,:device,:requires_grad,:layout,:pin_memory
nn.Module class *args,**kwargs
nn.Parameter class *args,**kwargs
nn.Linear class in_features,out_features,bias,device,dtype
nn.Embedding class num_embeddings,embedding_dim,padding_idx,max_norm,norm_type,scale_grad_by_freq,sparse,_weight,_freeze,device,dtype
nn.LayerNorm class normalized_shape,eps,elementwise_affine,bias,device,dtype
nn.RMSNorm class normalized_shape,eps,elementwise_affine,device,dtype
nn.GroupNorm class num_groups,num_channels,eps,affine,device,dtype,:bias
nn.Dropout class p,inplace
nn.GELU class approximate
nn.ReLU class inplace
nn.SiLU class inplace
nn.Tanh class *args,**kwargs
nn.Sigmoid class *args,**kwargs
nn.Softmax class dim
nn.LogSoftmax class dim
nn.LeakyReLU class negative_slope,inplace
nn.ELU class alpha,inplace
nn.Softplus class beta,threshold
nn.Mish class inplace
nn.Identity class *args,**kwargs
nn.Flatten class start_dim,end_dim
nn.Unflatten class dim,unflattened_size
nn.Sequential class *args
nn.ModuleList class modules
nn.ModuleDict class modules
nn.ParameterList class values
nn.ParameterDict class parameters
nn.CrossEntropyLoss class weight,size_average,ignore_index,reduce,reduction,label_smoothing
nn.MSELoss class size_average,reduce,reduction
nn.L1Loss class size_average,reduce,reduction
nn.NLLLoss class weight,size_average,ignore_index,reduce,reduction
nn.BCELoss class weight,size_average,reduce,reduction
nn.BCEWithLogitsLoss class weight,size_average,reduce,reduction,pos_weight
nn.KLDivLoss class size_average,reduce,reduction,log_target
nn.SmoothL1Loss class size_average,reduce,reduction,beta
nn.HuberLoss class reduction,delta
nn.MultiheadAttention class embed_dim,num_heads,dropout,bias,add_bias_kv,add_zero_attn,kdim,vdim,batch_first,device,dtype
nn.Conv1d class in_channels,out_channels,kernel_size,stride,padding,dilation,groups,bias,padding_mode,device,dtype
nn.Conv2d class in_channels,out_channels,kernel_size,stride,padding,dilation,groups,bias,padding_mode,device,dtype
nn.init.normal_ callable tensor,mean,std,generator
nn.init.zeros_ callable tensor
nn.init.ones_ callable tensor
nn.init.constant_ callable tensor,val
nn.init.uniform_ callable tensor,a,b,generator
nn.init.xavier_uniform_ callable tensor,gain,generator
nn.init.xavier_normal_ callable tensor,gain,generator
nn.init.kaiming_uniform_ callable tensor,a,mode,nonlinearity,generator
nn.init.kaiming_normal_ callable tensor,a,mode,nonlinearity,generator
nn.init.trunc_normal_ callable tensor,mean,std,a,b,generator
nn.utils.clip_grad_norm_ callable parameters,max_norm,norm_type,error_if_nonfinite,foreach
nn.utils.clip_grad_value_ callable parameters,clip_value,foreach
nn.utils.parameters_to_vector callable parameters
nn.utils.vector_to_parameters callable vec,parameters
nn.parallel.DistributedDataParallel class module,device_ids,output_device,dim,broadcast_buffers,init_sync,process_group,bucket_cap_mb,find_unused_parameters,check_reduction,gradient_as_bucket_view,static_graph,delay_all_reduce_named_params,param_to_hook_all_reduce,mixed_precision,device_mesh,skip_all_reduce_unused_params,bucket_cap_mb_list,batched_grad_copy,forward_sync_buffers,lazy_bucket_allocation
F.linear callable input,weight,bias
F.embedding callable input,weight,padding_idx,max_norm,norm_type,scale_grad_by_freq,sparse
F.layer_norm callable input,normalized_shape,weight,bias,eps
F.rms_norm callable input,normalized_shape,weight,eps
F.group_norm callable input,num_groups,weight,bias,eps
F.dropout callable input,p,training,inplace
F.gelu callable input,approximate
F.relu callable input,inplace
F.silu callable input,inplace
F.tanh callable input
F.sigmoid callable input
F.softmax callable input,dim,_stacklevel,dtype
F.log_softmax callable input,dim,_stacklevel,dtype
F.softplus callable input,beta,threshold
F.leaky_relu callable input,negative_slope,inplace
F.elu callable input,alpha,inplace
F.mish callable input,inplace
F.logsigmoid callable input
F.glu callable input,dim
F.scaled_dot_product_attention callable query,key,value,attn_mask,dropout_p,is_causal,scale,:enable_gqa
F.cross_entropy callable input,target,weight,size_average,ignore_index,reduce,reduction,label_smoothing
F.nll_loss callable input,target,weight,size_average,ignore_index,reduce,reduction
F.mse_loss callable input,target,size_average,reduce,reduction,weight
F.l1_loss callable input,target,size_average,reduce,reduction,weight
F.smooth_l1_loss callable input,target,size_average,reduce,reduction,beta
F.huber_loss callable input,target,reduction,delta,weight
F.binary_cross_entropy callable input,target,weight,size_average,reduce,reduction
F.binary_cross_entropy_with_logits callable input,target,weight,size_average,reduce,reduction,pos_weight
F.kl_div callable input,target,size_average,reduce,reduction,log_target
F.cosine_similarity callable x1,x2,dim,eps
F.pairwise_distance callable x1,x2,p,eps,keepdim
F.normalize callable input,p,dim,eps,out
F.pad callable input,pad,mode,value
F.one_hot callable tensor,num_classes
F.conv1d callable input,weight,bias,stride,padding,dilation,groups
F.conv2d callable input,weight,bias,stride,padding,dilation,groups
optim.Optimizer class params,defaults
optim.SGD class params,lr,momentum,dampening,weight_decay,nesterov,:maximize,:foreach,:differentiable,:fused
optim.Adam class params,lr,betas,eps,weight_decay,amsgrad,:foreach,:maximize,:capturable,:differentiable,:fused,:decoupled_weight_decay
optim.AdamW class params,lr,betas,eps,weight_decay,amsgrad,:maximize,:foreach,:capturable,:differentiable,:fused
optim.RMSprop class params,lr,alpha,eps,weight_decay,momentum,centered,capturable,foreach,maximize,differentiable
optim.Adagrad class params,lr,lr_decay,weight_decay,initial_accumulator_value,eps,foreach,:maximize,:differentiable,:fused
optim.lr_scheduler.LRScheduler class optimizer,last_epoch
optim.lr_scheduler.LambdaLR class optimizer,lr_lambda,last_epoch
optim.lr_scheduler.StepLR class optimizer,step_size,gamma,last_epoch
optim.lr_scheduler.MultiStepLR class optimizer,milestones,gamma,last_epoch
optim.lr_scheduler.ExponentialLR class optimizer,gamma,last_epoch
optim.lr_scheduler.CosineAnnealingLR class optimizer,T_max,eta_min,last_epoch
optim.lr_scheduler.LinearLR class optimizer,start_factor,end_factor,total_iters,last_epoch
optim.lr_scheduler.ConstantLR class optimizer,factor,total_iters,last_epoch
optim.lr_scheduler.OneCycleLR class optimizer,max_lr,total_steps,epochs,steps_per_epoch,pct_start,anneal_strategy,cycle_momentum,base_momentum,max_momentum,div_factor,final_div_factor,three_phase,last_epoch
optim.lr_scheduler.SequentialLR class optimizer,schedulers,milestones,last_epoch
optim.lr_scheduler.ReduceLROnPlateau class optimizer,mode,factor,patience,threshold,threshold_mode,cooldown,min_lr,eps
optim.lr_scheduler.CosineAnnealingWarmRestarts class optimizer,T_0,T_mult,eta_min,last_epoch
utils.data.Dataset class *args,**kwargs
utils.data.IterableDataset class *args,**kwargs
utils.data.TensorDataset class *tensors
utils.data.DataLoader class dataset,batch_size,shuffle,sampler,batch_sampler,num_workers,collate_fn,pin_memory,drop_last,timeout,worker_init_fn,multiprocessing_context,generator,:prefetch_factor,:persistent_workers,:pin_memory_device,:in_order
utils.data.Sampler class *args,**kwargs
utils.data.RandomSampler class data_source,replacement,num_samples,generator
utils.data.SequentialSampler class data_source
utils.data.BatchSampler class sampler,batch_size,drop_last
utils.data.DistributedSampler class dataset,num_replicas,rank,shuffle,seed,drop_last
utils.data.Subset class dataset,indices
utils.data.random_split callable dataset,lengths,generator
utils.data.ConcatDataset class datasets
utils.data.default_collate callable batch
utils.data.get_worker_info callable
utils.checkpoint.checkpoint callable function,*args,:use_reentrant,:preserve_rng_state,:context_fn,:determinism_check,:debug,:early_stop,:respect_saved_tensors_hooks,**kwargs
cuda.is_available callable
cuda.device_count callable
cuda.current_device callable
cuda.set_device callable device
cuda.synchronize callable device
cuda.manual_seed callable seed
cuda.manual_seed_all callable seed
cuda.is_bf16_supported callable including_emulation
cuda.memory_allocated callable device
cuda.memory_reserved callable device
cuda.max_memory_allocated callable device
cuda.max_memory_reserved callable device
cuda.reset_peak_memory_stats callable device
cuda.empty_cache callable
cuda.Stream class *args,**kwargs
cuda.Event class *args,**kwargs
cuda.stream callable stream
cuda.current_stream callable device
cuda.get_device_name callable device
cuda.amp.autocast class enabled,dtype,cache_enabled
cuda.amp.GradScaler class init_scale,growth_factor,backoff_factor,growth_interval,enabled
amp.autocast class device_type,dtype,enabled,cache_enabled
amp.GradScaler class device,init_scale,growth_factor,backoff_factor,growth_interval,enabled
backends.cuda.matmul.allow_tf32 value
backends.cudnn.allow_tf32 value
backends.cudnn.benchmark value
backends.cudnn.deterministic value
distributed.init_process_group callable backend,init_method,timeout,world_size,rank,store,group_name,pg_options,device_id,_ranks,enable_reconfigure
distributed.destroy_process_group callable group
distributed.get_rank callable group
distributed.get_world_size callable group
distributed.is_initialized callable
distributed.is_available callable
distributed.barrier callable group,async_op,device_ids,timeout
distributed.all_reduce callable tensor,op,group,async_op
distributed.broadcast callable tensor,src,group,async_op,group_src
distributed.all_gather callable tensor_list,tensor,group,async_op
distributed.all_gather_into_tensor callable output_tensor,input_tensor,group,async_op
distributed.reduce_scatter_tensor callable output,input,op,group,async_op
distributed.ReduceOp class
autograd.grad callable outputs,inputs,grad_outputs,retain_graph,create_graph,only_inputs,allow_unused,is_grads_batched,materialize_grads
autograd.backward callable tensors,grad_tensors,retain_graph,create_graph,grad_variables,inputs
autograd.Function class *args,**kwargs
"""

# Parameters no name here takes: writing into a given tensor and PyTorch's storage layouts.
IGNORED = frozenset(("out", "layout", "memory_format"))
# A first positional parameter by any of these names is a tensor passed by position in practice.
INPUT_NAMES = frozenset(("input", "self", "tensor", "x", "a", "t"))

# Observable differences of names that are present. Tensors here own contiguous storage: reshape-type views (view,
# reshape, flatten, squeeze, unsqueeze, view_as) share it as PyTorch's do, but the results of the ops below are
# copies, so an in-place write to them does not reach the source.
_COPY = "returns a copy, not a view: an in-place write to the result does not change the source"
NOTES = {
    **dict.fromkeys(
        [
            "torch.transpose",
            "torch.permute",
            "torch.movedim",
            "torch.t",
            "torch.swapaxes",
            "torch.narrow",
            "torch.diagonal",
            "torch.broadcast_to",
            "Tensor.transpose",
            "Tensor.permute",
            "Tensor.t",
            "Tensor.T",
            "Tensor.mT",
            "Tensor.narrow",
            "Tensor.expand",
            "Tensor.expand_as",
        ],
        _COPY,
    ),
    "torch.Generator": "its state (get_state/set_state) is a dict of seed and offset, not a byte tensor; one "
    "counter-based stream serves every device",
    "torch.get_rng_state": "a dict of seed and offset, not a byte tensor",
    "torch.set_rng_state": "takes get_rng_state's dict",
    "cuda.manual_seed": "one generator serves every device, so this seeds the cpu's draws too",
    "cuda.manual_seed_all": "one generator serves every device, so this seeds the cpu's draws too",
    "torch.dtype": "dtypes are their names (a str subclass): it.float32 == 'float32'",
    "torch.device": "devices are their canonical names (a str subclass with type and index): "
    "it.device('cuda') == 'cuda:0'",
    "Tensor.grad_fn": "the autograd node, with name() and next_functions only",
}

ROOTS = ("torch", "Tensor", "nn", "F", "optim", "utils", "cuda", "amp", "backends", "distributed", "autograd")


def entries():
    """(name, kind, params or None) for every line of NAMES."""
    out = []
    for line in NAMES.strip().splitlines():
        parts = line.split(" ")
        name, kind = parts[0], parts[1]
        params = parts[2].split(",") if len(parts) > 2 else ([] if kind != "value" else None)
        out.append((name, kind, params))
    return out


def _root(it, root):
    import infinitrain.nn.functional as fn

    return {
        "torch": it,
        "Tensor": it.Tensor,
        "nn": it.nn,
        "F": fn,
        "optim": it.optim,
        "utils": getattr(it, "utils", None),
        "cuda": getattr(it, "cuda", None),
        "amp": it.amp,
        "backends": it.backends,
        "distributed": it.distributed,
        "autograd": getattr(it, "autograd", None),
    }[root]


def resolve(it, name):
    """Our object for a PyTorch name, or raises AttributeError."""
    root, *rest = name.split(".")
    obj = _root(it, root)
    if obj is None:
        raise AttributeError(root)
    for part in rest:
        obj = getattr(obj, part)
    return obj


def _signature(obj):
    target = obj.__init__ if inspect.isclass(obj) else obj
    if isinstance(target, property):
        return None
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def compare(obj, params, method=False):
    """What of PyTorch's parameters `obj` does not accept, as a list of short phrases (empty: it accepts all).
    method: obj is a Tensor method, whose first parameter is the tensor itself."""
    sig = _signature(obj)
    if sig is None:
        return [] if callable(obj) else ["not callable"]
    ours = list(sig.parameters.values())
    if (method and inspect.isfunction(obj)) or inspect.isclass(obj):
        if ours and ours[0].kind != ours[0].VAR_POSITIONAL:
            ours = ours[1:]  # the tensor (self) of a method, the instance of __init__
    var_pos = next((i for i, p in enumerate(ours) if p.kind == p.VAR_POSITIONAL), None)
    var_kw = any(p.kind == p.VAR_KEYWORD for p in ours)
    by_name = {p.name: p for p in ours if p.kind != p.POSITIONAL_ONLY}
    positional = [p for p in ours if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    problems = []
    pos = 0
    for theirs in params:
        if theirs.startswith("**"):
            continue
        if theirs.startswith("*"):
            if var_pos is None and not (pos < len(positional)):
                problems.append(f"no {theirs}")
            pos = 10**6  # everything after *args is keyword-only
            continue
        keyword_only = theirs.startswith(":")
        pname = theirs.lstrip(":")
        if pname in IGNORED:
            continue
        if keyword.iskeyword(pname):  # such a parameter (Tensor.uniform_'s from) can only be passed by position
            pos += 1
            continue
        if keyword_only:
            if pname not in by_name and not var_kw:
                problems.append(f"no {pname}=")
            continue
        if pos < len(positional):
            mine = positional[pos].name
            if mine != pname and not (pos == 0 and pname in INPUT_NAMES) and pname not in by_name and not var_kw:
                problems.append(f"parameter {pos + 1} is {mine}, PyTorch's {pname}")
        elif var_pos is None and pname not in by_name:
            problems.append(f"no {pname}")
        pos += 1
    return problems


def probe():
    """Rows (group, name, status, note): status present, differs or missing."""
    import infinitrain as it

    rows = []
    for name, kind, params in entries():
        group = name.split(".")[0]
        try:
            obj = resolve(it, name)
        except AttributeError:
            rows.append((group, name, "missing", ""))
            continue
        problems = [] if kind == "value" or params is None else compare(obj, params, name.startswith("Tensor."))
        note = "; ".join(problems + ([NOTES[name]] if name in NOTES else []))
        rows.append((group, name, "differs" if note else "present", note))
    return rows


def render(rows):
    total = len(rows)
    count = {s: sum(1 for r in rows if r[2] == s) for s in ("present", "differs", "missing")}
    lines = [
        "# PyTorch API compatibility",
        "",
        "Generated by `python -m infinitrain.tools.pytorch_api` (CI checks it is current). A list of "
        f"{total} of PyTorch's most used public names, each looked up where PyTorch has it: `torch.X` as `it.X`, "
        "`Tensor.X`, `nn.X`, `F.X` (`nn.functional`), `optim.X`, `utils.X`, `cuda.X`, `amp.X`, `backends.X`, "
        "`distributed.X`, `autograd.X`.",
        "",
        "- **present**: there, taking PyTorch's parameters (positionally where PyTorch's are positional, by name "
        "where they are keyword-only); `out=`, `layout=` and `memory_format=` are accepted nowhere and left out "
        "of the comparison.",
        "- **differs**: there, with the difference said.",
        "- **missing**: not there.",
        "",
        "Behaviour (values, dtypes, broadcasting, gradients) is tested by the shared suites against float64 NumPy "
        "(tests/core/test_pytorch_api.py and the op suites), on every provider.",
        "",
        f"**Coverage: {count['present']} of {total} present ({100.0 * count['present'] / total:.1f}%), "
        f"{count['differs']} differ, {count['missing']} missing.**",
        "",
    ]
    for group in ROOTS:
        g = [r for r in rows if r[0] == group]
        if not g:
            continue
        ok = sum(1 for r in g if r[2] == "present")
        lines += [f"## {group} ({ok} of {len(g)} present)", "", "| name | status | note |", "|---|---|---|"]
        lines += [f"| `{n}` | {s} | {note} |" for _, n, s, note in g]
        lines.append("")
    return "\n".join(lines)


def coverage(rows):
    return sum(1 for r in rows if r[2] == "present") / len(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="", help="write the report here (default: standard output)")
    p.add_argument("--check", default="", help="fail unless this file holds the current report")
    args = p.parse_args(argv)
    rows = probe()
    text = render(rows)
    n = len(rows)
    present = sum(1 for r in rows if r[2] == "present")
    summary = f"pytorch api: {present} of {n} present ({100.0 * present / n:.1f}%)"
    if args.check:
        with open(args.check) as f:
            if f.read() != text:
                print(f"{args.check} is stale: python -m infinitrain.tools.pytorch_api --output {args.check}")
                return 1
        print(summary)
        return 0
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(summary)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
