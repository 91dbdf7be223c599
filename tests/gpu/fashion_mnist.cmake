# The main job on the GPU (label gpu): fashion_mnist --device cuda against --device cpu, on a
# generated data set (the GPU machine has no dataset package). tests/CMakeLists.txt includes this
# file where the example is built.
nodal_add_test(fashion_mnist_gpu_test gpu TIMEOUT 300 ${CMAKE_CURRENT_LIST_DIR}/fashion_mnist_gpu_test.cpp)
target_compile_definitions(fashion_mnist_gpu_test PRIVATE NODAL_TEST_FASHION_MNIST="$<TARGET_FILE:fashion_mnist>")
target_link_libraries(fashion_mnist_gpu_test PRIVATE nodal::runtime)  # nodal::cuda::available()
add_dependencies(fashion_mnist_gpu_test fashion_mnist)
